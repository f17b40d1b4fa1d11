"""Keep the code shown in docs/plugins/ identical to the code that is tested.

Two markers, each on the line before a fenced code block:

* ``<!-- generated: KIND NAME PATH -->``: the block is the file PATH that
  ``rlhf plugin new KIND NAME`` writes; this script rewrites the block from the templates.
* ``<!-- file: PATH -->``: the block is an excerpt of the repository file PATH (a tested
  plugin or example); this script only checks that it is there verbatim.

``python scripts/sync_plugin_docs.py`` rewrites generated blocks; ``--check`` changes nothing and
exits 1 naming every stale or unmatched block (tests/test_docs_examples.py runs it).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = ROOT / "docs" / "plugins"
BLOCK = re.compile(r"<!-- (generated|file): ([^>]+?) -->\n```(\w*)\n(.*?)```", re.DOTALL)


def sync(text: str, page: Path, problems: list[str]) -> str:
    from rlhf_plugin_scaffold.scaffold import render

    def replace(match: re.Match[str]) -> str:
        marker, args, lang, body = match.groups()
        if marker == "generated":
            kind, name, path = args.split()
            files = render(kind, name)
            if path not in files:
                problems.append(f"{page.name}: rlhf plugin new {kind} {name} writes no {path}")
                return match.group(0)
            return f"<!-- generated: {args} -->\n```{lang}\n{files[path]}```"
        source = ROOT / args.strip()
        if not source.is_file() or body not in source.read_text():
            problems.append(f"{page.name}: the block marked {args.strip()} is not in that file as shown")
        return match.group(0)

    return BLOCK.sub(replace, text)


def main(check: bool) -> int:
    problems: list[str] = []
    for page in sorted(PAGES.glob("*.md")):
        text = page.read_text()
        synced = sync(text, page, problems)
        if synced != text:
            if check:
                problems.append(f"{page.name}: generated code is stale; run python scripts/sync_plugin_docs.py")
            else:
                page.write_text(synced)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main("--check" in sys.argv[1:]))
