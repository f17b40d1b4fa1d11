"""``rlhf train NAME``: build the trainer's config from YAML and flags, then run it."""

from __future__ import annotations

import sys
from typing import Any

import yaml

from rlhf.config.loading import ConfigParser
from rlhf.host.plugin_host import PluginHost
from rlhf.registry import ComponentKind


def run_train(host: PluginHost, trainer_name: str | None, argv: list[str]) -> int:
    trainers = host.registry.registrations(ComponentKind.TRAINER)
    if trainer_name is None or trainer_name in {"-h", "--help"}:
        print("usage: rlhf train NAME [flags]   (rlhf train NAME --help lists the flags)\n\ntrainers:")
        for reg in trainers:
            print(f"  {reg.name:<12} {reg.description}  [plugin {reg.plugin}]")
        return 0
    trainer_cls, config, meta = train_config(host, trainer_name, argv)
    if meta.print_config:
        yaml.safe_dump(config.model_dump(mode="json"), sys.stdout, sort_keys=False)
        return 0
    from pathlib import Path

    from rlhf.console import attach_run_log

    run_dir = Path(getattr(getattr(config, "ckpt", None), "output_dir", ".") or ".")
    attach_run_log(run_dir)
    trainer_cls(config, host, run_dir).run()
    return 0


def train_config(host: PluginHost, trainer_name: str, argv: list[str]) -> tuple[Any, Any, Any]:
    """``(trainer class, config, parse meta)`` of ``rlhf train NAME ARGV``: the flags and YAML parsed, the
    trainer's cross-flag rules applied (``prepare_config``), the resolved plugin set recorded."""
    trainer_cls = host.registry.get(ComponentKind.TRAINER, trainer_name, flag="rlhf train")
    parser = ConfigParser(
        trainer_cls.config_class, host, prog=f"rlhf train {trainer_name}", description=trainer_cls.__doc__ or ""
    )
    config, meta = parser.parse(argv)
    prepare = getattr(trainer_cls, "prepare_config", None)
    if prepare is not None:
        config = prepare(config, host)
    config.plugin_set = host.resolved()
    return trainer_cls, config, meta
