"""Conformance kits of trainers, commands and lifecycle observers (docs/plugins/<kind>.md)."""

from __future__ import annotations

import argparse
import importlib
import json
from pathlib import Path
from typing import Any, ClassVar

from rlhf.config.loading import ConfigParser
from rlhf.registry import ComponentKind
from rlhf.runtime.control.sample_records import sample_records
from rlhf.runtime.workers.batch import Sample
from rlhf.testing.conformance._core import (
    ComponentKit,
    ContractProperties,
    check_import_is_light,
    fail,
    load_plugin,
    not_collected,
    ppo_config,
)

TRAINER = ComponentKind.TRAINER.label
COMMAND = ComponentKind.COMMAND.label
OBSERVER = "lifecycle observer"
LIFECYCLE_HOOKS = ("rlhf_worker_init", "rlhf_train_start", "rlhf_step_end", "rlhf_train_end", "rlhf_checkpoint_save",
                   "rlhf_checkpoint_load", "rlhf_rollout_samples")


def check_trainer(trainer_cls: Any, module: str, argv: list[str] | None, run_dir: Path | None) -> None:
    """``config_class`` is a pydantic model with ``plugins``/``plugin_set`` fields whose every flag parses
    through the real CLI parser; with ``argv`` and ``run_dir``, the trainer also runs there."""
    from pydantic import BaseModel

    config_class = getattr(trainer_cls, "config_class", None)
    if not (isinstance(config_class, type) and issubclass(config_class, BaseModel)):
        raise fail(TRAINER, "config_class", f"must be a pydantic BaseModel subclass, got {config_class!r}")
    missing = [f for f in ("plugins", "plugin_set") if f not in config_class.model_fields]
    if missing:
        raise fail(TRAINER, "config_class", f"lacks the field(s) {missing}; use rlhf.config.base.plugin_options_field() "
                   "and plugin_set_field()")
    host = load_plugin(module, TRAINER, every_installed=True)
    try:
        parser = ConfigParser(config_class, host, prog="rlhf train kit")
        config, _ = parser.parse(list(argv or []))
    except Exception as exc:  # noqa: BLE001
        raise fail(TRAINER, "flags parse", f"{type(exc).__name__}: {exc}", f"argv {argv or []}") from None
    if argv is not None and run_dir is not None:
        prepare = getattr(trainer_cls, "prepare_config", None)
        config = prepare(config, host) if prepare is not None else config
        config.plugin_set = host.resolved()
        try:
            trainer_cls(config, host, run_dir).run()
        except Exception as exc:  # noqa: BLE001
            raise fail(TRAINER, "runs", f"{type(exc).__name__}: {exc}", f"argv {argv}") from None


class TrainerKit(ContractProperties, ComponentKit):
    """Set ``component`` (the trainer class), ``plugin_module``, ``registered_name``; :meth:`argv` gives
    the flags of a run small enough for a test (None: only check that the flags parse)."""

    kind = ComponentKind.TRAINER
    contract_properties = ("config_class", "plugin loads", "flags parse", "runs")

    def argv(self) -> list[str] | None:
        return []

    def make_component(self) -> Any:
        return self.component

    test_picklable = None  # trainers run in the CLI process only; Ray never ships them

    @not_collected
    def test_contract(self, tmp_path: Path) -> None:
        check_trainer(self.component, self._module(), self.argv(), tmp_path)


def check_command(command_cls: Any, module: str, argv: list[str] | None) -> None:
    """A ``help`` string, ``add_arguments`` fills an argparse parser, and with ``argv`` the command
    parses them and ``run(host, args)`` returns an int exit status."""
    help_text = getattr(command_cls, "help", None)
    if not isinstance(help_text, str) or not help_text.strip():
        raise fail(COMMAND, "help", f"help must be a non-empty string, got {help_text!r}")
    parser = argparse.ArgumentParser(prog="rlhf kit")
    try:
        command_cls.add_arguments(parser)
    except Exception as exc:  # noqa: BLE001
        raise fail(COMMAND, "add_arguments", f"{type(exc).__name__}: {exc}") from None
    if argv is None:
        return
    host = load_plugin(module, COMMAND, every_installed=True)
    status = command_cls().run(host, parser.parse_args(argv))
    if not isinstance(status, int):
        raise fail(COMMAND, "run", f"returned {status!r}, expected an int exit status", f"argv {argv}")


class CommandKit(ContractProperties, ComponentKit):
    """Set ``component`` (the command class); :meth:`argv` gives arguments for one quick run (None: no run)."""

    kind = ComponentKind.COMMAND
    contract_properties = ("help", "add_arguments", "plugin loads", "run")

    def argv(self) -> list[str] | None:
        return []

    def make_component(self) -> Any:
        return self.component

    test_picklable = None  # commands run in the CLI process only

    @not_collected
    def test_contract(self) -> None:
        check_command(self.component, self._module(), self.argv())


def check_lifecycle_observer(module: str, run_dir: Path, config: Any = None) -> None:
    """The module implements at least one lifecycle hook, loads into a host, and a whole run's worth of
    lifecycle calls (worker init, start, steps, checkpoint save and load, end: completed and failed)
    goes through without raising; what it stores in a checkpoint's ``state`` is JSON."""

    implemented = [h for h in LIFECYCLE_HOOKS if callable(getattr(importlib.import_module(module), h, None))]
    if not implemented:
        raise fail(OBSERVER, "implements a lifecycle hook", f"{module} defines none of {', '.join(LIFECYCLE_HOOKS)}")
    host = load_plugin(module, OBSERVER)
    config = config if config is not None else ppo_config()
    checkpoint = run_dir / "checkpoint"
    checkpoint.mkdir(parents=True, exist_ok=True)
    state: dict[str, Any] = {}
    calls = [
        ("rlhf_worker_init", lambda: host.worker_init("actor", 0, config)),
        ("rlhf_train_start", lambda: host.train_start(config, run_dir)),
        ("rlhf_rollout_samples", lambda: host.rollout_samples(1, "train", kit_rollout_samples(1, trained=True))),
        ("rlhf_step_end", lambda: host.step_end(1, {"reward": 0.5, "kl": 0.01, "policy_loss": -0.2})),
        ("rlhf_rollout_samples", lambda: host.rollout_samples(1, "eval", kit_rollout_samples(1, trained=False))),
        ("rlhf_step_end", lambda: host.step_end(2, {})),
        ("rlhf_checkpoint_save", lambda: host.checkpoint_save(2, checkpoint, state)),
        ("rlhf_checkpoint_load", lambda: host.checkpoint_load(2, checkpoint, json.loads(json.dumps(state)))),
        ("rlhf_train_end", lambda: host.train_end(config, run_dir, "completed")),
        ("rlhf_train_end", lambda: host.train_end(config, run_dir, "failed")),
    ]
    for hook, call in calls:
        try:
            call()
        except Exception as exc:  # noqa: BLE001
            raise fail(OBSERVER, hook, str(exc)) from None
        if hook == "rlhf_checkpoint_save":
            try:
                json.dumps(state)
            except (TypeError, ValueError) as exc:
                raise fail(OBSERVER, "checkpoint state is JSON", str(exc)) from None


def kit_rollout_samples(step: int, trained: bool) -> list[dict[str, Any]]:
    """Four samples of two prompts as ``rlhf_rollout_samples`` hands them over (a multi-turn one, a cut one, a
    reward term and a plugin's column); ``trained``: with advantages, returns and trainer log-probs, as a step's."""
    samples = [Sample(prompt_ids=[1, 2, 3], response_ids=[4 + i, 5, 6], rollout_logprobs=[-0.5, -1.0, -0.25],
                      prompt=f"question {i // 2}\n", response=f"answer {i}", label=str(i // 2), group=i // 2,
                      finish_reason="length" if i == 3 else "stop", reward=float(i % 2), score=float(i % 2),
                      action_mask=[1, 0, 1] if i == 2 else None, terms={"kit_term": float(i % 2)},
                      columns={"kit_term/output": f"output {i}"}, policy_version=step - 1) for i in range(4)]
    rows = [[float(i % 2) - 0.5] * 3 for i in range(4)]
    return (sample_records(samples, step, rows, rows, [[-0.4, -1.1, -0.2]] * 4) if trained
            else sample_records(samples, step))


class LifecycleObserverKit(ContractProperties):
    """pytest kit for a plugin module of lifecycle hooks: ``class TestMine(LifecycleObserverKit): plugin_module = "pkg"``."""

    plugin_module: ClassVar[str | None] = None
    contract_properties = ("implements a lifecycle hook", "plugin loads", "rlhf_worker_init", "rlhf_train_start",
                           "rlhf_step_end", "rlhf_rollout_samples", "rlhf_checkpoint_save", "checkpoint state is JSON",
                           "rlhf_checkpoint_load", "rlhf_train_end")

    def _module(self) -> str:
        if not self.plugin_module:
            raise fail(OBSERVER, "kit set-up", f"set {type(self).__name__}.plugin_module to the module with the hooks")
        return self.plugin_module

    def run_config(self) -> Any:
        return ppo_config()

    def test_import_is_light(self) -> None:
        check_import_is_light(OBSERVER, self._module())

    @not_collected
    def test_lifecycle(self, tmp_path: Path) -> None:
        check_lifecycle_observer(self._module(), tmp_path, self.run_config())

    test_contract = test_lifecycle
