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
    """Every name, version, detail and fix is data, so each reaches rich as :class:`~rich.text.Text`, never as a
    string: rich would read ``pip install 'rlhf-core[cpu]'`` as markup and drop the ``[cpu]``."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    console = Console() if sys.stdout.isatty() else Console(width=160)
    versions = Table(title="versions", show_header=False)
    for name, version in found["versions"].items():
        versions.add_row(Text(name), Text(version) if version else Text("not installed", style="dim"))
    cuda = found["cuda"]
    versions.add_row("CUDA", Text(f"{cuda['torch_cuda'] or 'CPU build'}; {len(cuda['devices'])} device(s) "
                                  + ", ".join(cuda["devices"])))
    console.print(versions)
    plugins = Table(title="plugins")
    for column in ("name", "distribution", "version", "plugin API", "status"):
        plugins.add_column(column, overflow="fold")
    for record in found["plugins"]:
        colour = {"ok": "green", "blocked": "yellow"}.get(record["status"], "red")
        plugins.add_row(*map(Text, (record["name"], record["distribution"] or "-", record["version"] or "-",
                                    str(record["api_version"] or "-"))), Text(record["status"], style=colour))
    console.print(plugins)
    marks = {"ok": ("ok  ", "green"), "warn": ("warn", "yellow"), "fail": ("FAIL", "red")}
    for finding in found["findings"]:
        console.print(Text.assemble(marks[finding["status"]], f" {finding['check']}: {finding['detail']}"))
        if finding["fix"]:
            console.print(Text(f"      fix: {finding['fix']}"))
    console.print(Text("healthy", style="green") if found["healthy"]
                  else Text.assemble(("problems found", "red"), ": see the FAIL lines"))
