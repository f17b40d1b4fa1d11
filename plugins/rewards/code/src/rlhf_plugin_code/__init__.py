"""``code_tests``: 1.0 when the response's Python code passes the label's tests, else 0.0.

The code is the last fenced ```python block of the response (or the whole response);
the label is test code (asserts) appended to it. Each sample runs in a sandbox
(:mod:`rlhf_plugin_code.sandbox`): a separate process in its own network and user
namespaces, wall-time / CPU / memory / file-size / open-file limits, a throwaway
working directory, capped output, and an audit hook that refuses process creation,
sockets, ctypes and writes outside the working directory. Every failure is a 0 reward
with its reason counted in ``extra_logs`` (``code/<reason>``).
Options: ``--code.wall_s``, ``--code.cpu_s``, ``--code.memory_mb``, ``--code.output_kb``.
"""

import rlhf

rlhf_plugin_api = rlhf.PLUGIN_API_VERSION


@rlhf.hookimpl
def rlhf_register_reward_functions(register):
    register("code_tests", "rlhf_plugin_code.reward:CodeTestsReward", description="run code against tests in a sandbox")


@rlhf.hookimpl
def rlhf_register_options(register):
    register("rlhf_plugin_code.sandbox:SandboxLimits", namespace="code")
