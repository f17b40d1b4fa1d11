"""Both length penalties through the reward-shaper kit, enabled by their flags."""

from rlhf_plugin_length_penalties import OverlongPenalty, StopProperlyPenalty

from rlhf.testing.conformance import RewardShaperKit, ppo_config


class TestOverlongPenalty(RewardShaperKit):
    component, plugin_module, registered_name = OverlongPenalty, "rlhf_plugin_length_penalties", "overlong_penalty"
    max_length = 16

    def run_config(self):
        config = ppo_config()
        config.reward.overlong_buffer_len, config.rollout.max_new_tokens = 4, 16
        return config


class TestStopProperlyScale(RewardShaperKit):
    component, plugin_module, registered_name = StopProperlyPenalty, "rlhf_plugin_length_penalties", "stop_properly_penalty"

    def run_config(self):
        config = ppo_config()
        config.reward.stop_properly_penalty_coef = 0.5
        return config


class TestStopProperlyReplace(TestStopProperlyScale):
    def run_config(self):
        config = ppo_config()
        config.reward.stop_properly_penalty_coef = -1.0
        return config
