"""Write docs/hooks.md from the hook specs' signatures and docstrings.

    python scripts/gen_hook_docs.py          # rewrite docs/hooks.md
    python scripts/gen_hook_docs.py --check  # exit 1 when docs/hooks.md is stale
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

from rlhf import hookspecs

DOC = Path(__file__).resolve().parent.parent / "docs" / "hooks.md"

HEADER = """# Hook reference

Generated from `core/src/rlhf/hookspecs.py` by `python scripts/gen_hook_docs.py`; do not edit by hand.
Import the marker with `import rlhf` and decorate with `@rlhf.hookimpl`. An implementation may take
any subset of a hook's arguments. Registration hooks receive a `register` callable:
`register(name, target, description="")`, where `target` is the component or a lazy `"module:attr"` string.
"""


def hook_names() -> list[str]:
    return sorted(name for name, obj in vars(hookspecs).items() if name.startswith("rlhf_") and inspect.isfunction(obj))


def render() -> str:
    parts = [HEADER]
    for name in hook_names():
        func = getattr(hookspecs, name)
        args = ", ".join(inspect.signature(func).parameters)
        parts.append(f"## `{name}({args})`\n\n{inspect.cleandoc(func.__doc__ or '')}\n")
    return "\n".join(parts)


def main() -> int:
    text = render()
    if "--check" in sys.argv:
        if not DOC.is_file() or DOC.read_text() != text:
            print(f"{DOC} is stale: run python scripts/gen_hook_docs.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
