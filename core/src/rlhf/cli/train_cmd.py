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
    from rlhf.cli.plan_cmd import check_before_run, make_plan, print_plan, split_plan_args

    plan_args, argv = split_plan_args(argv, with_json=False)
    run = trainer_run(host, trainer_name, argv)
    if plan_args.plan_only:
        plan = make_plan(run, host, plan_args)
        print_plan(plan, f"rlhf train {trainer_name} --plan")
        return 0
    check_before_run(run, host, plan_args)
    if run.print_config:
        yaml.safe_dump(run.config.model_dump(mode="json"), sys.stdout, sort_keys=False)
        return 0
    attach_run_log(run.run_dir)
    ckpt = getattr(run.config, "ckpt", None)
    if hasattr(ckpt, "preemption_signals"):  # a trainer's config with the shared PreemptionFields
        preemption.watch(ckpt.preemption_signals, ckpt.preemption_budget)
    run.trainer(run.config, host, run.run_dir).run()
    return 0
