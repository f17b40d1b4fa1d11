"""The kd trainer through the trainer kit: its config tree and flags (its runs are in the other tests)."""

from rlhf_plugin_kd.trainer import KDTrainer

from rlhf.testing.conformance import TrainerKit


class TestKDTrainer(TrainerKit):
    component, plugin_module, registered_name = KDTrainer, "rlhf_plugin_kd", "kd"

    def argv(self):
        return None  # a run needs a model: covered by the end-to-end tests
