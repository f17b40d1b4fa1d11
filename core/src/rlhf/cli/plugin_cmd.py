"""``rlhf plugin new KIND NAME``: write a ready plugin package (see :mod:`rlhf.scaffold`)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_plugin_parser(sub: argparse._SubParsersAction) -> None:
    from rlhf.scaffold import KINDS

    plugin = sub.add_parser("plugin", help="plugin authoring: rlhf plugin new KIND NAME")
    actions = plugin.add_subparsers(dest="plugin_action", metavar="ACTION")
    new = actions.add_parser("new", help="write a plugin package that pip install -e and pytest accept as it is",
                             description=f"kinds: {', '.join(KINDS)}")
    new.add_argument("kind", metavar="KIND", help="the component kind: " + ", ".join(KINDS))
    new.add_argument("name", metavar="NAME", help="the component name (lower case, digits, underscores)")
    new.add_argument("--dir", default=".", help="where to create rlhf-plugin-NAME/ (default: the current directory)")


def run_plugin_command(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    if args.plugin_action != "new":
        parser.error("rlhf plugin: give an action, e.g. rlhf plugin new advantage-estimator my_estimator")
    from rlhf.scaffold import KINDS, write_plugin

    directory = write_plugin(args.kind, args.name, Path(args.dir))
    spec = KINDS[args.kind.replace("_", "-")]
    print(f"wrote {directory} ({spec.name} {args.name!r})\n"
          f"next: pip install -e {directory} && (cd {directory} && pytest)\n"
          f"contract: docs/plugins/{spec.doc}")
    return 0
