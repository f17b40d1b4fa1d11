"""``rlhf plugins``: what is installed, what it registers, and why something did not load."""

from __future__ import annotations

import json
import sys

from rlhf.host.plugin_host import PluginHost
from rlhf.host.selection import PluginRecord
from rlhf.registry import ComponentKind


def show_plugins(host: PluginHost, *, as_json: bool, kind: str | None) -> int:
    records = [r for r in host.records if kind is None or r.kind == kind or kind in _kinds_registered(r)]
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


def _kinds_registered(record: PluginRecord) -> set[str]:
    """The plugin kinds of what a plugin registers: a package with a reward and an estimator is both."""
    return {ComponentKind(kind).plugin_kind for kind in record.components}
