"""The per-sample math reward through the reward-function kit."""

from rlhf_plugin_math.answer import MathAnswer

from rlhf.testing.conformance import RewardFunctionKit


class TestMathAnswer(RewardFunctionKit):
    component, plugin_module, registered_name = MathAnswer, "rlhf_plugin_math", "math_answer"
