"""``rlhf plugins``: what is installed, what it registers, and why something did not load."""

from __future__ import annotations

import json
import sys

from rlhf.errors import ConfigError
from rlhf.host.plugin_host import PLUGIN_KINDS, PluginHost
from rlhf.host.selection import PluginRecord
from rlhf.registry import ComponentKind

#: what a plugin record's kind is when it does not come from an entry-point group
RECORD_KINDS = ("builtin", "module", "file")


def show_plugins(host: PluginHost, *, as_json: bool, kind: str | None) -> int:
    records = host.records if kind is None else [r for r in host.records if matches_kind(r, kind, host)]
    if as_json:
        json.dump([r.to_dict() for r in records], sys.stdout, indent=2)
        sys.stdout.write("\n")
        return 0
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title="rlhf plugins", show_lines=False)
    for column in ("name", "kind", "distribution", "version", "status", "registers", "hooks"):
        table.add_column(column, overflow="fold")
    for r in records:
        registers = "; ".join(f"{k}: {', '.join(v)}" for k, v in r.components.items())
        if r.options:
            registers += ("; " if registers else "") + f"options: {', '.join('--' + o + '.*' for o in r.options)}"
        status = Text(r.status, style={"ok": "yellow" if r.warning else "green", "blocked": "yellow"}.get(r.status, "red"))
        if r.reason or r.warning:  # a warning: loaded, e.g. despite an upper cap that excludes this core
            status.append(f": {r.reason or r.warning}")
        # Text cells, not strings: rich would read a reason's "pip install 'x[gpu]'" as markup and drop the [gpu]
        table.add_row(*map(Text, (r.name, r.kind, r.distribution or "-", r.version or "-")), status,
                      Text(registers or "-"), Text(", ".join(r.hooks) or "-"))
    console = Console()
    if not console.is_terminal:
        console = Console(width=200)
    console.print(table)
    return 0


def matches_kind(record: PluginRecord, kind: str, host: PluginHost) -> bool:
    """``--kind``: a plugin kind (its entry-point group, ``backends``) or a component kind (``rollout-engine``,
    ``rollout_engines``), matched by the group a plugin is in and by everything it registers. Anything else is
    a user error (never an empty table): a component's own name says which kind to ask for."""
    wanted = kind.strip().lower().replace("-", "_")
    component = _component_kind(wanted)
    if component is not None:
        return component.value in record.components
    if wanted in (*PLUGIN_KINDS, *RECORD_KINDS) or wanted + "s" in PLUGIN_KINDS:
        wanted = wanted if wanted in (*PLUGIN_KINDS, *RECORD_KINDS) else wanted + "s"
        return record.kind == wanted or wanted in {ComponentKind(k).plugin_kind for k in record.components}
    raise ConfigError(_unknown_kind(kind, host))


def _component_kind(wanted: str) -> ComponentKind | None:
    """``rollout_engine``, ``rollout_engines``, ``policy_losses`` -> the component kind, else None."""
    for component in ComponentKind:
        if wanted in (component.value, component.hook_name.removeprefix("rlhf_register_")):
            return component
    return None


def _unknown_kind(kind: str, host: PluginHost) -> str:
    named = [reg for reg in host.registry.registrations() if reg.name == kind]
    if named:
        reg = named[0]
        return (f"--kind {kind}: {kind!r} is the name of a {reg.kind.label} (plugin {reg.plugin!r}), not a kind; "
                f"rlhf plugins --kind {reg.kind.value.replace('_', '-')} lists it with the others of its kind")
    components = ", ".join(k.value.replace("_", "-") for k in ComponentKind)
    return f"--kind {kind}: not a kind; give a plugin kind ({', '.join(PLUGIN_KINDS)}) or a component kind ({components})"
