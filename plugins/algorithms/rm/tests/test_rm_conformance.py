"""The rm trainer through the trainer kit: its config tree and flags (its runs are in the other tests)."""

from rlhf_plugin_rm.trainer import RewardModelTrainer

from rlhf.testing.conformance import TrainerKit


class TestRewardModelTrainer(TrainerKit):
    component, plugin_module, registered_name = RewardModelTrainer, "rlhf_plugin_rm", "rm"

    def argv(self):
        return None  # a run needs a model: covered by the end-to-end tests
