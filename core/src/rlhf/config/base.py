"""Building blocks of the typed configuration tree.

Every section is a pydantic model that forbids unknown keys. A field's CLI shape
(store_true switch, ``nargs``, a negating ``--no_x`` switch, a component kind whose
names come from the plugin registries) rides along in its ``json_schema_extra`` so
the argparse bridge can generate every dotted flag from the model itself.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rlhf.errors import ConfigError  # noqa: F401 - re-exported: config code raises it from here
from rlhf.registry import ComponentKind

__all__ = ["Section", "flag", "plugin_flag", "plugin_options_field", "plugin_set_field", "cli_extra"]


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, assignments are validated."""

    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, protected_namespaces=(), ser_json_inf_nan="constants"
    )


def flag(
    default: Any = None,
    help: str = "",
    *,
    switch: bool = False,
    nargs: int | str | None = None,
    negate: str | None = None,
    component: ComponentKind | None = None,
    default_factory: Any = None,
    cli: bool = True,
) -> Any:
    """A config field with its CLI shape.

    ``switch``: a store_true flag (default False). ``nargs``: several values after the flag.
    ``negate``: the name of an extra store_false flag in the same section (OpenRLHF's
    ``--actor.muon.no_nesterov``). ``component``: the value names a registered component.
    ``cli=False``: a YAML-only field with no flag.
    """
    extra: dict[str, Any] = {}
    if switch:
        extra["switch"] = True
    if nargs is not None:
        extra["nargs"] = nargs
    if negate:
        extra["negate"] = negate
    if component is not None:
        extra["component"] = component.value
    if not cli:
        extra["no_cli"] = True
    if default_factory is not None:
        return Field(default_factory=default_factory, description=help, json_schema_extra=extra)
    return Field(default=default, description=help, json_schema_extra=extra)


def plugin_flag(plugin: str, default: Any = None, help: str = "", **shape: Any) -> Any:
    """A :func:`flag` the core keeps (OpenRLHF's name) but the plugin named ``plugin`` implements (a model
    plugin, :mod:`rlhf.models.extensions`, or an observer); setting it without that plugin loaded is an
    error that says what to install. ``shape``: :func:`flag`'s keyword arguments."""
    field = flag(default, help, **shape)
    field.json_schema_extra["plugin"] = plugin
    return field


def plugin_options_field() -> Any:
    """The ``plugins`` field of every trainer's config tree: plugin options by namespace (YAML only)."""
    return flag(default_factory=dict, help="Options of plugins, by plugin namespace (flags: --<namespace>.<field>)",
                cli=False)


def plugin_set_field() -> Any:
    """The ``plugin_set`` field of every trainer's config tree, written by rlhf and reloaded by workers."""
    return flag(default_factory=list, help="The resolved plugin set of the run (written by rlhf; do not edit)", cli=False)


def cli_extra(field_info: Any) -> dict[str, Any]:
    extra = field_info.json_schema_extra
    return extra if isinstance(extra, dict) else {}


def flagged_fields(config: Section, prefix: str = "") -> Iterator[tuple[str, str, bool]]:
    """``(dotted flag, plugin name, set away from its default)`` for every plugin-implemented field."""
    for name, field in type(config).model_fields.items():
        value = getattr(config, name)
        if isinstance(value, BaseModel):
            yield from flagged_fields(value, f"{prefix}{name}.")
            continue
        plugin = cli_extra(field).get("plugin")
        if plugin:
            yield f"{prefix}{name}", plugin, value != field.get_default(call_default_factory=True)
