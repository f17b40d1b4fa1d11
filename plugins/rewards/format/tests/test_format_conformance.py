"""The format reward through the reward-function kit."""

from rlhf_plugin_format.pattern import FormatReward

from rlhf.testing.conformance import RewardFunctionKit


class TestFormat(RewardFunctionKit):
    component, plugin_module, registered_name = FormatReward, "rlhf_plugin_format", "format"
