"""Generate argparse flags from a pydantic config model, and turn parsed flags back into a tree.

argparse does the parsing; the model is the single source of names, defaults, help
and types. Only flags the user actually gave reach the result (``default=SUPPRESS``),
so YAML values survive unless a flag overrides them.
"""

from __future__ import annotations

import argparse
import difflib
import typing
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel

from rlhf.config.base import ConfigError, cli_extra
from rlhf.registry import ComponentKind, ComponentRegistry


def _section_class(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def _choices(annotation: Any) -> list[Any] | None:
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Literal:
        return list(typing.get_args(annotation))
    if len(args) == 1 and typing.get_origin(args[0]) is typing.Literal:
        return list(typing.get_args(args[0]))
    return None


def _default_text(field: Any) -> str:
    if field.default_factory is not None:
        return ""
    return f" (default: {field.default})"


def add_model_flags(
    parser: argparse.ArgumentParser,
    model: type[BaseModel],
    *,
    prefix: str = "",
    dest_prefix: str = "",
    group: Any = None,
    registry: ComponentRegistry | None = None,
    refused: Mapping[str, str] | None = None,
) -> list[str]:
    """Add one ``--<prefix><field>`` flag per leaf field of ``model``; returns the flag names.

    Without an explicit ``group``, the leaf fields of every (sub-)section form a help
    group titled ``--<section>.*``; top-level leaves go to "general options". ``refused``
    (dotted option -> reason, see :mod:`rlhf.config.refused`) marks those flags' help.
    """
    flags: list[str] = []
    leaves = group
    for name, field in model.model_fields.items():
        extra = cli_extra(field)
        if extra.get("no_cli"):
            continue
        sub = _section_class(field.annotation)
        if sub is not None:
            flags += add_model_flags(
                parser, sub, prefix=f"{prefix}{name}.", dest_prefix=f"{dest_prefix}{name}.", group=group, registry=registry,
                refused=refused,
            )
            continue
        if leaves is None:
            leaves = parser.add_argument_group(f"--{prefix}*" if prefix else "general options")
        option = f"--{prefix}{name}"
        kwargs: dict[str, Any] = {"dest": f"{dest_prefix}{name}", "default": argparse.SUPPRESS}
        help_text = field.description or ""
        if refused and f"{dest_prefix}{name}" in refused:
            help_text = f"[REFUSED: {refused[f'{dest_prefix}{name}']}] {help_text}"
        if extra.get("switch"):
            kwargs.update(action="store_const", const=True)
        else:
            if "nargs" in extra:
                kwargs["nargs"] = extra["nargs"]
            choices = _choices(field.annotation)
            if choices:
                kwargs["choices"] = choices
            kwargs["metavar"] = name.upper()
            component = extra.get("component")
            if component:
                kwargs["metavar"] = "NAME"
                if registry is not None:
                    installed = sorted(registry.names(ComponentKind(component)))
                    help_text += f"; installed: {', '.join(installed) or '(none)'}"
            help_text += _default_text(field)
        kwargs["help"] = help_text.replace("%", "%%")
        leaves.add_argument(option, **kwargs)
        flags.append(option)
        if extra.get("negate"):
            negated = f"--{prefix}{extra['negate']}"
            leaves.add_argument(
                negated, dest=f"{dest_prefix}{name}", action="store_const", const=False, default=argparse.SUPPRESS,
                help=f"(sets {prefix}{name}=False)",
            )
            flags.append(negated)
    return flags


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"actor.adam.lr": 1}`` -> ``{"actor": {"adam": {"lr": 1}}}``."""
    tree: dict[str, Any] = {}
    for dotted, value in flat.items():
        node = tree
        *parents, leaf = dotted.split(".")
        for part in parents:
            existing = node.setdefault(part, {})
            if not isinstance(existing, dict):
                raise ConfigError(f"{'.'.join(parents)} is a value, but {dotted} treats it as a section")
            node = existing
        node[leaf] = value
    return tree


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def reject_unknown(unknown: list[str], known_flags: list[str], where: str) -> None:
    """Turn argparse's leftovers into one error that suggests the closest flag names."""
    problems = []
    for token in unknown:
        if not token.startswith("--"):
            problems.append(f"unexpected value {token!r}")
            continue
        name = token.split("=", 1)[0]
        close = difflib.get_close_matches(name, known_flags, n=1, cutoff=0.6)
        problems.append(f"unknown flag {name}" + (f"; did you mean {close[0]}?" if close else ""))
    if problems:
        raise ConfigError(f"{where}: " + "; ".join(problems) + ". See --help for every flag.")
