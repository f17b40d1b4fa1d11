"""The sft trainer through the trainer kit: its config tree and flags (its runs are in the other tests)."""

from rlhf_plugin_sft.trainer import SFTTrainer

from rlhf.testing.conformance import TrainerKit


class TestSFTTrainer(TrainerKit):
    component, plugin_module, registered_name = SFTTrainer, "rlhf_plugin_sft", "sft"

    def argv(self):
        return None  # a run needs a model: covered by the end-to-end tests
