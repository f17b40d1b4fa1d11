"""The `weighted` reward manager passes the reward-manager kit, summing the kit's two reward functions."""

from rlhf_plugin_weighted_rewards.manager import WeightedRewards

from rlhf.testing.conformance import RewardManagerKit, ppo_config


class TestWeightedRewards(RewardManagerKit):
    component = WeightedRewards
    plugin_module = "rlhf_plugin_weighted_rewards"
    registered_name = "weighted"

    def run_config(self):
        return ppo_config(reward={"functions": "kit_length:1.0,kit_label:0.5"})
