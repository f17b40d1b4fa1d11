"""The dpo trainer through the trainer kit: its config tree and flags (its runs are in the other tests)."""

from rlhf_plugin_dpo.trainer import DPOTrainer

from rlhf.testing.conformance import TrainerKit


class TestDPOTrainer(TrainerKit):
    component, plugin_module, registered_name = DPOTrainer, "rlhf_plugin_dpo", "dpo"

    def argv(self):
        return None  # a run needs a model: covered by the end-to-end tests
