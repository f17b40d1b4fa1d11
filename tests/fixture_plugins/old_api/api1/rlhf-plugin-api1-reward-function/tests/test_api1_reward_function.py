"""The `api1_reward_function` reward function against the rlhf conformance kit; add tests of your own formulas here."""

from rlhf_plugin_api1_reward_function.reward import Api1RewardFunctionReward

from rlhf.testing.conformance import RewardFunctionKit


class TestApi1RewardFunctionReward(RewardFunctionKit):
    component = Api1RewardFunctionReward  # built like the runtime builds it: Api1RewardFunctionReward.from_config(config)
    plugin_module = "rlhf_plugin_api1_reward_function"
    registered_name = "api1_reward_function"
