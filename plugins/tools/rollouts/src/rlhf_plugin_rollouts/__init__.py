"""See what the model generates.

During an RL run, ``--logger.samples N`` prints N of each logged step's samples (and of each evaluation's) as a
table above the progress bar, from the ``rlhf_rollout_samples`` hook. After it, ``rlhf rollouts show|summary DIR``
reads what ``--rollout.dump_dir DIR`` wrote. This module runs at plugin load and imports nothing heavy.
Process: the controller of an RL run (the hooks), the CLI (the command).
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)

#: the run's ``--logger.samples`` and how often it shows them, set as it starts
_shown = {"count": 0, "every": 1}


@rlhf.hookimpl
def rlhf_register_commands(register):
    register("rollouts", "rlhf_plugin_rollouts.command:RolloutsCommand",
             description="show a run's dumped rollouts (--rollout.dump_dir), or summarise them per step with a chart")


@rlhf.hookimpl
def rlhf_train_start(config):
    from rlhf.records.rollouts import samples_shown_every

    logger = getattr(config, "logger", None)  # a third-party trainer's config may have no such logger section
    if hasattr(logger, "samples"):
        _shown["count"], _shown["every"] = logger.samples, samples_shown_every(logger)


@rlhf.hookimpl
def rlhf_rollout_samples(step, kind, samples):
    if _shown["count"] <= 0 or (kind == "train" and step % _shown["every"]):
        return
    from rlhf_plugin_rollouts.console import print_samples

    print_samples(step, kind, samples, _shown["count"])
