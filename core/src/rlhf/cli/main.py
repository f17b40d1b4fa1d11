"""Entry point of the ``rlhf`` command.

Plugins are selected before any subcommand parses its flags, because plugins add
trainers, component names and option namespaces to those flags. Heavy libraries
(torch, ray, deepspeed, vllm) are imported only by the subcommands that run models.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from rlhf import __version__
from rlhf.console import configure_console
from rlhf.environment import torchvision_clash
from rlhf.errors import ConfigError, OneLineArgumentParser, debug_requested, exception_chain, find_user_error, render_exit
from rlhf.host.plugin_host import PluginHost
from rlhf.host.selection import ENV_PLUGINS, ENV_STRICT, PluginSelection

PLUGIN_HELP = f"""\
plugin selection (same syntax in ${ENV_PLUGINS}; the flag wins when both are set):
  --plugins a,b          load only these installed plugins (entry-point or distribution names)
  --plugins no:c         load everything installed except c
  --plugins pkg.module   also load a plugin module that is not packaged
  --plugins ./my.py      also load a plugin from a .py file
  --plugins ''           load no installed plugin (recovery: `rlhf --plugins '' plugins`)
  --strict-plugins       any plugin failure is an error (also ${ENV_STRICT}=1)

errors: a mistake in flags, files, data or plugins prints one `rlhf: error: …` line and exits 2;
  --debug (or RLHF_DEBUG=1) also prints the traceback.

plugins add commands too (e.g. `rlhf generate` from rlhf-plugin-best-of-n); `rlhf plugins --kind algorithms` lists them.
"""


def _selection_parser() -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--plugins", dest="plugins_spec", default=None)
    parser.add_argument("--strict-plugins", action="store_true")
    parser.add_argument("--debug", action="store_true")
    parser.add_argument("--verbose", action="store_true")
    return parser


def split_plugin_args(argv: list[str]) -> tuple[PluginSelection, list[str]]:
    """Take ``--plugins``/``--strict-plugins``/``--debug``/``--verbose`` from anywhere in argv (before or after the subcommand)."""
    known, rest = _selection_parser().parse_known_args(argv)
    try:
        return PluginSelection.from_cli(known.plugins_spec, known.strict_plugins), rest
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def build_parser(commands: Sequence[tuple[str, str]] = ()) -> argparse.ArgumentParser:
    """The parser of the built-in commands; ``commands`` (name, help) adds the plugins' to its listing."""
    parser = OneLineArgumentParser(
        prog="rlhf",
        description="rlhf: plugin-based reinforcement learning from human feedback.",
        epilog=PLUGIN_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"rlhf-core {__version__}")
    parser.add_argument("--plugins", dest="plugins_spec", metavar="SPEC", help="plugin selection, see below")
    parser.add_argument("--strict-plugins", action="store_true", help="any plugin failure is an error")
    parser.add_argument("--debug", action="store_true", help="print the traceback of an error (also RLHF_DEBUG=1)")
    parser.add_argument("--verbose", action="store_true", help="also show library warnings and logs (always in the "
                        "run's rlhf.log; also RLHF_VERBOSE=1)")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    plugins = sub.add_parser("plugins", help="list installed plugins, their components and status")
    plugins.add_argument("--json", action="store_true", help="machine-readable output")
    plugins.add_argument("--kind", help="only plugins of this kind (algorithms, rewards, agents, models, optimizers, "
                         "backends, tools) or that register this component kind (rollout-engine, reward-function, …)")
    train = sub.add_parser("train", help="run a trainer: rlhf train NAME [flags] (rlhf train NAME --help)", add_help=False)
    train.add_argument("trainer", nargs="?", help="trainer name")
    sub.add_parser("plan", help="where each model goes and what each GPU holds: rlhf plan train NAME [flags] "
                   "(docs/plan.md)", add_help=False)
    sub.add_parser("checkpoint", help="what a checkpoint holds, and a plain HF model from it: rlhf checkpoint "
                   "inspect|export PATH (docs/preemption.md)", add_help=False)
    for name, help_text in commands:  # listed in `rlhf --help`, "serve reward" whole; run by rlhf.cli.plugin_cmd
        sub.add_parser(name, help=help_text, add_help=False)
    return parser


BUILTIN_COMMANDS = ("plugins", "train", "plan", "checkpoint")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    configure_console(verbose="--verbose" in argv)
    from rlhf.cli.interrupts import handle_sigterm, report_interrupt

    handle_sigterm()
    try:
        return _dispatch(argv)
    except SystemExit:
        raise
    except KeyboardInterrupt as exc:  # Ctrl-C or SIGTERM: one line, status 130 or 143
        return report_interrupt(exc)
    except BaseException as exc:  # noqa: BLE001 - every error leaves through one renderer
        return render_exit(_environment_cause(exc), debug_requested(argv))


def _environment_cause(exc: BaseException) -> BaseException:
    """An import failure deep inside a library (e.g. transformers' ``Could not import module 'LlamaConfig'``) is
    often a broken environment: a known breakage is then the user error to report, with its fix."""
    chain = list(exception_chain(exc))
    if find_user_error(exc) is not None or not any(isinstance(e, ImportError) or "torchvision" in str(e) for e in chain):
        return exc
    if (clash := torchvision_clash()) is None:
        return exc
    cause = ConfigError(str(clash))
    cause.__cause__ = exc
    return cause


def _dispatch(argv: list[str]) -> int:
    selection, rest = split_plugin_args(argv)
    first = next((i for i, arg in enumerate(rest) if not arg.startswith("-")), None)
    if first is not None and rest[first] not in BUILTIN_COMMANDS:
        from rlhf.cli.plugin_cmd import run_plugin_command

        return run_plugin_command(selection, rest, first)
    if first is None:  # `rlhf`, `rlhf --help`: the listing names the plugins' commands too
        from rlhf.registry import ComponentKind

        registry = PluginHost.load(selection).registry
        parser = build_parser([(reg.name, reg.description) for reg in registry.registrations(ComponentKind.COMMAND)])
        parser.parse_args(rest)
        parser.print_help()
        return 0
    parser = build_parser()
    args, extra = parser.parse_known_args(rest)
    host = PluginHost.load(selection)
    if args.command == "plugins":
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        from rlhf.cli.plugins_cmd import show_plugins

        return show_plugins(host, as_json=args.json, kind=args.kind)
    if args.command == "plan":
        from rlhf.cli.plan_cmd import run_plan

        return run_plan(host, rest[first + 1 :])
    if args.command == "checkpoint":
        from rlhf.cli.checkpoint_cmd import run_checkpoint

        return run_checkpoint(host, rest[first + 1 :])
    from rlhf.cli.train_cmd import run_train

    return run_train(host, args.trainer, extra)
