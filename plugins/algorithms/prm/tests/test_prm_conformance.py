"""The prm trainer through the trainer kit: its config tree and flags (its runs are in the other tests)."""

from rlhf_plugin_prm.trainer import PRMTrainer

from rlhf.testing.conformance import TrainerKit


class TestPRMTrainer(TrainerKit):
    component, plugin_module, registered_name = PRMTrainer, "rlhf_plugin_prm", "prm"

    def argv(self):
        return None  # a run needs a model: covered by the end-to-end tests
