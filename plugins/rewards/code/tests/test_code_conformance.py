"""The code_tests reward through the reward-function kit (sandboxed runs of small programs)."""

from rlhf_plugin_code.reward import CodeTestsReward

from rlhf.testing.conformance import RewardFunctionKit


class TestCodeTests(RewardFunctionKit):
    component, plugin_module, registered_name = CodeTestsReward, "rlhf_plugin_code", "code_tests"

    def samples(self):
        program = "```python\ndef f(x):\n    return x + 1\n```"
        return [("write f", program, "assert f(1) == 2"), ("write f", program, "assert f(1) == 3"), ("write f", "", "assert f(1) == 2")]
