"""`rlhf train api2_trainer` against the rlhf conformance kit; add tests of your own here."""

from rlhf_plugin_api2_trainer.trainer import Api2Trainer

from rlhf.testing.conformance import TrainerKit


class TestApi2Trainer(TrainerKit):
    component = Api2Trainer
    plugin_module = "rlhf_plugin_api2_trainer"
    registered_name = "api2_trainer"

    def argv(self):
        return ["--message", "from the kit"]  # the flags of one quick run (None: only check they parse)
