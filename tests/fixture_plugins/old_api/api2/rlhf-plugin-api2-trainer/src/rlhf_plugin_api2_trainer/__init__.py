"""rlhf-plugin-api2-trainer: `rlhf train api2_trainer`.

This module is imported by every `rlhf` command: it imports only `rlhf` and registers the
trainer as a lazy "module:attr" string, imported only when `rlhf train api2_trainer` runs.
"""

import rlhf

rlhf_plugin_api = rlhf.PLUGIN_API_VERSION


@rlhf.hookimpl
def rlhf_register_trainers(register):
    register("api2_trainer", "rlhf_plugin_api2_trainer.trainer:Api2Trainer",
             description="TODO: what rlhf train api2_trainer does, in one line")
