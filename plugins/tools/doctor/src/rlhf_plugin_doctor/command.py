"""``rlhf doctor [--json] [--address ADDR]``: exit 0 when nothing is wrong, 1 when a check failed."""

from __future__ import annotations

import json
import sys
from typing import Any, ClassVar


class DoctorCommand:
    """Checks this environment (ds_report, vllm collect-env and ray status for an rlhf run, in one place)."""

    help: ClassVar[str] = "check this environment: versions, CUDA, plugins, sandbox, Ray; a fix for each problem"

    @classmethod
    def add_arguments(cls, parser: Any) -> None:
        parser.add_argument("--json", action="store_true", help="print the report as JSON")
        parser.add_argument("--address", default=None,
                            help="a Ray cluster to check (ray://host:10001 or host:6379; default: RAY_ADDRESS, else none)")

    def run(self, host: Any, args: Any) -> int:
        from rlhf_plugin_doctor.checks import report

        found = report(host, args.address)
        if args.json:
            json.dump(found, sys.stdout, indent=2)
            sys.stdout.write("\n")
        else:
            _show(found)
        return 0 if found["healthy"] else 1


def _show(found: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console() if sys.stdout.isatty() else Console(width=160)
    versions = Table(title="versions", show_header=False)
    for name, version in found["versions"].items():
        versions.add_row(name, version or "[dim]not installed[/]")
    cuda = found["cuda"]
    versions.add_row("CUDA", f"{cuda['torch_cuda'] or 'CPU build'}; {len(cuda['devices'])} device(s) "
                             + ", ".join(cuda["devices"]))
    console.print(versions)
    plugins = Table(title="plugins")
    for column in ("name", "distribution", "version", "plugin API", "status"):
        plugins.add_column(column, overflow="fold")
    for record in found["plugins"]:
        colour = {"ok": "green", "blocked": "yellow"}.get(record["status"], "red")
        plugins.add_row(record["name"], record["distribution"] or "-", record["version"] or "-",
                        str(record["api_version"] or "-"), f"[{colour}]{record['status']}[/]")
    console.print(plugins)
    marks = {"ok": "[green]ok[/]  ", "warn": "[yellow]warn[/]", "fail": "[red]FAIL[/]"}
    for finding in found["findings"]:
        console.print(f"{marks[finding['status']]} {finding['check']}: {finding['detail']}", highlight=False)
        if finding["fix"]:
            console.print(f"      fix: {finding['fix']}", highlight=False)
    console.print("[green]healthy[/]" if found["healthy"] else "[red]problems found[/]: see the FAIL lines")
