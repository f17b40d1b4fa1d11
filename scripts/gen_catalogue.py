"""Write core/src/rlhf/host/first_party.json: which first-party distribution registers which component.

The core reads it for "install X to get Y" hints (rlhf.host.catalogue), which matter exactly when the
distribution is not installed, so the table is taken here, once, from a checkout where every
first-party plugin is installed: the distributions named by plugins/*/*/pyproject.toml, each
one's registrations as `rlhf plugins` sees them.

    python scripts/gen_catalogue.py          # rewrite the file
    python scripts/gen_catalogue.py --check  # exit 1 when it is stale (tests/test_packaging.py)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "core" / "src" / "rlhf" / "host" / "first_party.json"


def first_party_distributions() -> list[str]:
    """The first-party plugins: a folder without entry points is a library that registers nothing (rlhf-supervised)."""
    projects = (tomllib.loads(p.read_text())["project"] for p in ROOT.glob("plugins/*/*/pyproject.toml"))
    return sorted(project["name"] for project in projects if "entry-points" in project)


def render() -> str:
    from rlhf.host.plugin_host import PluginHost
    from rlhf.host.selection import PluginSelection, canonical

    wanted = {canonical(name): name for name in first_party_distributions()}
    host = PluginHost.load(PluginSelection.parse(None, strict=True))
    table: dict[str, dict[str, list[str]]] = {}
    for record in host.loaded():
        if record.distribution and canonical(record.distribution) in wanted:
            registered = {kind: sorted(names) for kind, names in sorted(record.components.items())}
            if registered:
                table.setdefault(wanted[canonical(record.distribution)], {}).update(registered)
    missing = sorted(set(wanted.values()) - set(table) - _registering_nothing(host, wanted))
    if missing:
        sys.exit(f"gen_catalogue: not installed here (pip install -e their folders): {', '.join(missing)}")
    lines = [f"  {json.dumps(distribution)}: {json.dumps(table[distribution])}" for distribution in sorted(table)]
    return "{\n" + ",\n".join(lines) + "\n}\n"  # one line per distribution: small diffs, easy merges


def _registering_nothing(host, wanted: dict[str, str]) -> set[str]:
    """Installed first-party distributions that register no component (hooks or options only)."""
    from rlhf.host.selection import canonical

    return {wanted[canonical(r.distribution)] for r in host.loaded()
            if r.distribution and canonical(r.distribution) in wanted and not r.components}


def main() -> int:
    text = render()
    if "--check" in sys.argv[1:]:
        if not OUTPUT.is_file() or OUTPUT.read_text() != text:
            print(f"{OUTPUT.relative_to(ROOT)} is stale: run python scripts/gen_catalogue.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
