"""No option accepted and ignored: every option of every trainer is read by code, or refused.

An option ``<...>.<section>.<field>`` counts as read when the runtime or a plugin (the code
that trains, not the config package that parses and cross-checks flags) holds an attribute
chain ending in ``<section>.<field>`` (``cfg.ds.zero_stage``, ``ds = config.ds; ds.zero_stage``),
or ``section.<field>`` (code that reads the same field of several sections, e.g. the actor's
and the critic's ``max_norm``); a top-level option needs ``config.<field>`` or ``cfg.<field>``.
The code of the other trainer family does not count (the supervised loop reading
``ds.packing_samples`` does not make PPO pack). Every other option must be in
:data:`rlhf.config.refused.REFUSED`, where setting it is an error that says why.
"""

from __future__ import annotations

import ast
import typing
from functools import cache
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, Field

import rlhf
from rlhf.config.base import ConfigError, Section, cli_extra, flag
from rlhf.config.loading import ConfigParser
from rlhf.config.ppo import PPOConfig
from rlhf.config.refused import REFUSED, refusals, refuse
from rlhf.host.plugin_host import PluginHost
from rlhf.host.selection import PluginSelection
from rlhf.registry import ComponentKind
from rlhf.testing.cli import assert_user_error, run_rlhf

CORE = Path(rlhf.__file__).parent
PLUGINS = Path(__file__).parents[1] / "plugins"
#: Core modules only one trainer family runs (the rest, e.g. DeepSpeed set-up and checkpoints, serve both).
FAMILY_ONLY = {
    "ppo": [p for p in (CORE / "runtime").glob("*.py") if p.name not in {"checkpoint.py", "tracking.py"}]
    + [CORE / "data" / "prompts.py"],
    "supervised": list((CORE / "supervised").glob("*.py")),
}
GENERIC_SECTION_NAMES = {"section"}
ROOT_NAMES = {"config", "cfg"}
#: Options whose whole effect happens while the config is built (so no runtime code reads them).
READ_AT_PARSE = {"algo.preset": "rlhf.config.loading.preset_tree expands it into the options it sets"}


def _stands_for(owner: str, section: str | None) -> bool:
    """Whether a variable named ``owner`` holds ``section`` (None: the whole config): the section's
    own name or that name with a suffix (``data_cfg``), or a generic name."""
    if owner in GENERIC_SECTION_NAMES:
        return True
    if section is None:
        return owner in ROOT_NAMES
    return owner == section or owner.startswith(f"{section}_")


@cache
def host() -> PluginHost:
    return PluginHost.load(PluginSelection.parse(None))


def trainer_configs() -> dict[str, type[BaseModel]]:
    registry = host().registry
    return {reg.name: registry.get(ComponentKind.TRAINER, reg.name).config_class
            for reg in registry.registrations(ComponentKind.TRAINER)}


def options(model: type[BaseModel], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    found = []
    for name, field in model.model_fields.items():
        if name in ("plugins", "plugin_set"):  # plugin options are the plugins' own; the set is written by rlhf
            continue
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            found += options(field.annotation, (*prefix, name))
        else:
            found.append((*prefix, name))
    return found


def _package_dir(cls: type) -> Path:
    import importlib

    return Path(importlib.import_module(cls.__module__.split(".")[0]).__file__).parent


@cache
def reader_files(family: str) -> tuple[Path, ...]:
    """Code that runs for ``family``: core outside config/ and the other family's modules, and every
    plugin except the trainer packages of the other family."""
    registry = host().registry
    other_trainers = {_package_dir(registry.get(ComponentKind.TRAINER, reg.name))
                      for reg in registry.registrations(ComponentKind.TRAINER)
                      if getattr(registry.get(ComponentKind.TRAINER, reg.name).config_class, "trainer_family", None) != family}
    excluded = {p for other, files in FAMILY_ONLY.items() if other != family for p in files}
    core = [p for p in CORE.rglob("*.py") if "config" not in p.relative_to(CORE).parts[:1] and p not in excluded]
    plugins = [p for p in PLUGINS.glob("*/*/src/**/*.py") if not any(d in p.parents for d in other_trainers)]
    return tuple(core + plugins)


def _name(node: ast.AST) -> str | None:
    """The name an expression ends in: ``a.b`` -> b, ``a`` -> a, ``getattr(a, "b")`` -> b, ``a["b"]`` -> b."""
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    key = _string_key(node)
    return key[1] if key else None


def _string_key(node: ast.AST) -> tuple[ast.AST, str] | None:
    """``(owner, key)`` of ``owner["key"]``, ``getattr(owner, "key"…)`` and ``owner.get("key"…)``."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.value, node.slice.value
    if isinstance(node, ast.Call):
        if _is_get(node) and _is_str(node.args[:1]):
            return node.func.value, node.args[0].value
        if getattr(node.func, "id", None) == "getattr" and _is_str(node.args[1:2]):
            return node.args[0], node.args[1].value
    return None


def _is_str(nodes: list[ast.AST]) -> bool:
    return bool(nodes) and isinstance(nodes[0], ast.Constant) and isinstance(nodes[0].value, str)


def _is_get(node: ast.Call) -> bool:
    return isinstance(node.func, ast.Attribute) and node.func.attr == "get"


@cache
def read_suffixes(files: tuple[Path, ...]) -> frozenset[tuple[str, str]]:
    """Every (owner, field) pair read in ``files``: ``cfg.ds.zero_stage`` gives ("ds", "zero_stage"), as do
    ``ds["zero_stage"]`` and ``getattr(ds, "zero_stage")``. A variable bound to an attribute in the same
    file stands for it too: after ``m = self.config.model``, ``m.beta`` gives ("model", "beta")."""
    pairs = set()
    for path in files:
        tree = ast.parse(path.read_text(), str(path))
        aliases: dict[str, set[str]] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and (bound := _name(node.value)) is not None:
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        aliases.setdefault(target.id, set()).add(bound)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                owner, field = node.value, node.attr
            elif (key := _string_key(node)) is not None:
                owner, field = key
            else:
                continue
            name = _name(owner)
            for alias in {name, *aliases.get(name, ())} - {None}:
                pairs.add((alias, field))
    return frozenset(pairs)


def switched_plugin(model: type[BaseModel], option: tuple[str, ...]) -> str | None:
    """The model plugin a :func:`rlhf.config.base.plugin_flag` option switches on, or None for other options."""
    for name in option[:-1]:
        model = model.model_fields[name].annotation
    return cli_extra(model.model_fields[option[-1]]).get("plugin")


def unread_options(config_class: type[BaseModel], family: str) -> list[str]:
    pairs = read_suffixes(reader_files(family))
    installed_extensions = set(host().registry.names(ComponentKind.MODEL_LOADER))
    unread = []
    for option in options(config_class):
        section = option[-2] if len(option) > 1 else None
        # a plugin_flag option is read by rlhf.models.extensions.active, which builds its plugin's component
        if switched_plugin(config_class, option) in installed_extensions:
            continue
        if ".".join(option) in READ_AT_PARSE or any(
                field == option[-1] and _stands_for(owner, section) for owner, field in pairs):
            continue
        unread.append(".".join(option))
    return unread


def families() -> dict[str, type[BaseModel]]:
    """name -> config class, for ppo and every installed trainer."""
    return {"ppo": PPOConfig, **trainer_configs()}


@pytest.mark.parametrize("trainer", sorted(families()))
def test_every_option_is_read_or_refused(trainer: str) -> None:
    config_class = families()[trainer]
    family = config_class.trainer_family
    unread = set(unread_options(config_class, family))
    refused = set(refusals(config_class))
    assert not unread - refused, (
        f"rlhf train {trainer}: options that nothing reads: {sorted(unread - refused)}. Implement them, or add them to "
        "rlhf.config.refused.REFUSED with the reason")
    # no check the other way: a refused option may be read in part (the GPU share of colocated engines)


def test_every_refusal_names_an_option_of_its_family() -> None:
    by_family: dict[str, set[str]] = {}
    for config_class in families().values():
        by_family.setdefault(config_class.trainer_family, set()).update(".".join(o) for o in options(config_class))
    for (family, dotted), reason in REFUSED.items():
        known = set().union(*by_family.values()) if family == "*" else by_family[family]
        assert dotted in known, f"REFUSED names {family}:{dotted}, which is no option"
        assert reason.strip(), dotted


def test_an_option_nothing_reads_is_found() -> None:
    class Extra(Section):
        forgotten_enable: bool = flag(False, "an option nobody implemented", switch=True)

    class WithForgotten(PPOConfig):
        extra: Extra = Field(default_factory=Extra)

    assert unread_options(WithForgotten, "ppo") == [*unread_options(PPOConfig, "ppo"), "extra.forgotten_enable"]


def _other_value(annotation: Any, default: Any) -> Any:
    """A valid value of a field that differs from its default."""
    if isinstance(default, bool):
        return not default
    if isinstance(default, int):
        return default + 2
    if isinstance(default, float):
        return 0.5 if default != 0.5 else 0.25
    if isinstance(default, str):
        choices = [c for c in _literals(annotation) if c != default]
        return choices[0] if choices else default + "_x"
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if _literals(annotation):
        return _literals(annotation)[0]
    return {int: 3, str: "x", float: 0.5}[args[0]]


def _literals(annotation: Any) -> list[Any]:
    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    return [c for a in typing.get_args(annotation) for c in _literals(a)]


def _set(config: BaseModel, dotted: str) -> Any:
    *sections, leaf = dotted.split(".")
    node = config
    for name in sections:
        node = getattr(node, name)
    value = _other_value(type(node).model_fields[leaf].annotation, getattr(node, leaf))
    setattr(node, leaf, value)
    return value


@pytest.mark.parametrize("trainer", ["ppo", "sft"])
def test_setting_a_refused_option_is_an_error_that_names_it_and_why(trainer: str) -> None:
    config_class = families()[trainer]
    assert refuse(config_class()) is None  # defaults pass
    for dotted, reason in refusals(config_class).items():
        config = config_class()
        _set(config, dotted)
        with pytest.raises(ConfigError) as error:
            refuse(config)
        assert f"--{dotted} " in str(error.value) and reason in str(error.value)


def test_the_cli_refuses_with_one_line_and_help_marks_refused_options() -> None:
    values = {dotted: _set(PPOConfig(), dotted) for dotted in refusals(PPOConfig)}
    dotted = next(d for d, v in values.items() if v is not False)  # a False needs a --no_x switch
    flags = [f"--{dotted}"] + ([] if values[dotted] is True else [str(values[dotted])])
    reason = refusals(PPOConfig)[dotted]
    assert_user_error(run_rlhf("train", "ppo", *flags, "--print-config", timeout=120), f"--{dotted}", reason)
    parser = ConfigParser(PPOConfig, host(), prog="rlhf train ppo")
    help_text = " ".join(parser.parser.format_help().split())
    for refused_flag in refusals(PPOConfig):
        assert f"--{refused_flag}" in help_text
    assert help_text.count("[REFUSED: ") == len(refusals(PPOConfig))
    assert f"[REFUSED: {' '.join(reason.split())}]" in help_text


def test_config_convert_converts_a_refused_option_and_says_it_is_refused() -> None:
    dotted = next(d for d in refusals(PPOConfig) if isinstance(_set(PPOConfig(), d), bool) and _set(PPOConfig(), d))
    result = run_rlhf("config", "convert", "--trainer", "ppo", "--", "--pretrain", "m", f"--{dotted}", timeout=120)
    assert result.returncode == 0, result.stderr
    assert f"--{dotted}" in result.stdout
    assert f"this runtime refuses --{dotted} (set): {refusals(PPOConfig)[dotted]}" in result.stderr
