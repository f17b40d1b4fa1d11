"""A registered trainer's command line, parsed as ``rlhf train NAME …`` parses it, to run in this process.

For commands that drive trainers themselves (``rlhf demo`` runs SFT then GRPO) and tools that
read a trainer's command line without running it (``rlhf config convert``). The command line is
what a user types after ``rlhf train NAME``: dotted flags, ``--config YAML``, plugin options;
each loaded plugin's ``rlhf_translate_argv`` rewrites it first.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhf.config.cli_bridge import nest
from rlhf.config.loading import META_DESTS, ConfigParser
from rlhf.config.refused import refused_settings
from rlhf.console import attach_run_log
from rlhf.host.plugin_host import PluginHost
from rlhf.registry import ComponentKind

__all__ = ["TrainerRun", "trainer_run", "attach_run_log", "refused_settings"]


@dataclass
class TrainerRun:
    """A trainer's command line, parsed and validated. ``run.trainer(run.config, host, run.run_dir).run()``
    runs it in this process (the trainer may start Ray workers), as ``rlhf train`` does after
    :func:`attach_run_log` sends library logs to a run directory's ``rlhf.log``."""

    trainer: type
    # the trainer's ``config_class``, validated: any pydantic model a trainer plugin declares (RunConfig); Any because
    # the attribute is public and snapshot-tested in plugin API 3, where typing it is a change for the next API bump
    config: Any
    argv: list[str]  # the command line as parsed: after every plugin's rlhf_translate_argv
    given: list[str]  # the dotted options the command line (not the YAML file) set
    print_config: bool  # --print-config was given

    def given_tree(self) -> dict[str, Any]:
        """The options the command line set, with their validated values, as a nested tree (a YAML config's shape)."""
        dump = self.config.model_dump(mode="json")

        def value_at(dotted: str) -> Any:
            tree = dump
            for part in dotted.split("."):
                tree = tree[part]
            return tree

        return nest({key: value_at(key) for key in self.given})

    @property
    def run_dir(self) -> Path:
        """Where the run writes (``--ckpt.output_dir``, else the working directory)."""
        return Path(getattr(getattr(self.config, "ckpt", None), "output_dir", ".") or ".")


def trainer_run(host: PluginHost, trainer_name: str, argv: list[str], *, refusing: bool = True) -> TrainerRun:
    """Parse ``rlhf train TRAINER_NAME ARGV`` without running it: flags and YAML validated, the trainer's
    cross-flag rules applied (its ``prepare_config``), the resolved plugin set recorded in the config.

    ``refusing=False`` reads the options as given: those the runtime refuses pass (list them with
    :func:`refused_settings`) and ``prepare_config`` is not applied.
    Raises :class:`rlhf.errors.ConfigError` (one ``rlhf: error:`` line) for a bad flag, file or name."""
    trainer = host.registry.get(ComponentKind.TRAINER, trainer_name, flag="rlhf train")
    parser = ConfigParser(trainer.config_class, host, prog=f"rlhf train {trainer_name}", description=trainer.__doc__ or "")
    config, namespace = parser.parse(argv, refusing=refusing)
    prepare = getattr(trainer, "prepare_config", None)
    if prepare is not None and refusing:
        config = prepare(config, host)
    config.plugin_set = host.resolved()
    given = [key for key in vars(namespace) if key not in META_DESTS]
    return TrainerRun(trainer, config, parser.parsed_argv, given, bool(namespace.print_config))
