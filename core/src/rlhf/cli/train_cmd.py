"""``rlhf train NAME``: build the trainer's config from YAML and flags, then run it."""

from __future__ import annotations

import sys

import yaml

from rlhf.host.plugin_host import PluginHost
from rlhf.launch import attach_run_log, trainer_run
from rlhf.records import preemption
from rlhf.registry import ComponentKind


def run_train(host: PluginHost, trainer_name: str | None, argv: list[str]) -> int:
    trainers = host.registry.registrations(ComponentKind.TRAINER)
    if trainer_name is None or trainer_name in {"-h", "--help"}:
        print("usage: rlhf train NAME [flags]   (rlhf train NAME --help lists the flags)\n\ntrainers:")
        for reg in trainers:
            print(f"  {reg.name:<12} {reg.description}  [plugin {reg.plugin}]")
        return 0
    run = trainer_run(host, trainer_name, argv)
    if run.print_config:
        yaml.safe_dump(run.config.model_dump(mode="json"), sys.stdout, sort_keys=False)
        return 0
    attach_run_log(run.run_dir)
    ckpt = getattr(run.config, "ckpt", None)
    if hasattr(ckpt, "preemption_signals"):  # a trainer's config with the shared PreemptionFields
        preemption.watch(ckpt.preemption_signals, ckpt.preemption_budget)
    run.trainer(run.config, host, run.run_dir).run()
    return 0
