"""rlhf generate through the command kit: help and arguments (its runs are in the other tests)."""

from rlhf_plugin_best_of_n.command import GenerateCommand

from rlhf.testing.conformance import CommandKit


class TestGenerateCommand(CommandKit):
    component, plugin_module, registered_name = GenerateCommand, "rlhf_plugin_best_of_n", "generate"

    def argv(self):
        return None  # a run needs models: covered by test_best_of_n_e2e
