"""The kto trainer through the trainer kit: its config tree and flags (its runs are in the other tests)."""

from rlhf_plugin_kto.trainer import KTOTrainer

from rlhf.testing.conformance import TrainerKit


class TestKTOTrainer(TrainerKit):
    component, plugin_module, registered_name = KTOTrainer, "rlhf_plugin_kto", "kto"

    def argv(self):
        return None  # a run needs a model: covered by the end-to-end tests
