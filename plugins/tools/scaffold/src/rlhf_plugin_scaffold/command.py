"""``rlhf plugin new KIND NAME``: the command's flags, and the package it writes (see :mod:`rlhf_plugin_scaffold.scaffold`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

from rlhf.errors import ConfigError
from rlhf_plugin_scaffold.scaffold import KINDS, add_component, write_plugin


class PluginCommand:
    """Plugin authoring: ``rlhf plugin new KIND NAME`` writes a package that pip and pytest accept as it is."""

    help: ClassVar[str] = "plugin authoring: rlhf plugin new KIND NAME"

    @classmethod
    def add_arguments(cls, parser: Any) -> None:
        parser.add_argument("action", choices=["new"], help="new: write a plugin package that pip install -e and pytest "
                                                            "accept as it is")
        parser.add_argument("kind", metavar="KIND", help="the component kind: " + ", ".join(KINDS))
        parser.add_argument("name", metavar="NAME", help="the component name (lower case, digits, underscores)")
        parser.add_argument("--dir", default=".", help="where to create the package's folder (rlhf-plugin-NAME/)")
        parser.add_argument("--distribution", metavar="DIST", help="the package's distribution name (default "
                            "rlhf-plugin-NAME): its folder, its import package (- as _) and the plugin's name "
                            "(less a rlhf-plugin- prefix; --plugins no:PLUGIN) follow it")
        parser.add_argument("--into", metavar="PACKAGE_DIR", help="add the component to this existing plugin package "
                            "(its module, its kit test, its registration) instead of writing a new package")

    def run(self, host: Any, args: Any) -> int:
        if args.into:
            if args.distribution:
                raise ConfigError("rlhf plugin new --into adds to a package that has its distribution name already; "
                                  "drop --distribution")
            written = add_component(args.kind, args.name, Path(args.into))
            print(f"added {args.name!r} to {args.into}: " + ", ".join(str(path) for path in written) +
                  f"\nnext: pip install -e {args.into} && (cd {args.into} && python -m pytest)")
            return 0
        directory = write_plugin(args.kind, args.name, Path(args.dir), args.distribution)
        spec = KINDS[args.kind.replace("_", "-")]
        print(f"wrote {directory} ({spec.name} {args.name!r})\n"
              f"next: pip install -e {directory} && (cd {directory} && python -m pytest)\n"
              f"contract: docs/plugins/{spec.doc}")
        return 0
