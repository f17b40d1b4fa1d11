"""The `api2_reward_function` reward function against the rlhf conformance kit; add tests of your own formulas here."""

from rlhf_plugin_api2_reward_function.reward import Api2RewardFunctionReward

from rlhf.testing.conformance import RewardFunctionKit


class TestApi2RewardFunctionReward(RewardFunctionKit):
    component = Api2RewardFunctionReward  # built like the runtime builds it: Api2RewardFunctionReward.from_config(config)
    plugin_module = "rlhf_plugin_api2_reward_function"
    registered_name = "api2_reward_function"
