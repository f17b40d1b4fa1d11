"""The `async` scheduler passes the rollout-scheduler kit (its producer thread against the kit's loop)."""

from rlhf_plugin_async_rollout.producer import AheadOfTraining

from rlhf.testing.conformance import RolloutSchedulerKit, ppo_config


class TestAheadOfTraining(RolloutSchedulerKit):
    component = AheadOfTraining
    plugin_module = "rlhf_plugin_async_rollout"
    registered_name = "async"

    def run_config(self):
        return ppo_config(train={"async_enable": True})
