"""``rlhf config convert``: an OpenRLHF command line or shell script -> today's dotted command and a YAML config.

Finds every OpenRLHF command in a script (``deepspeed --module openrlhf.cli.train_sft …``,
``ray job submit … -- python3 -m openrlhf.cli.train_ppo_ray …``, the examples' ``read -d '' … <<EOF``
blocks, or ``rlhf train NAME …``), translates its flags with the tables of
:mod:`rlhf_plugin_openrlhf_compat.tables`, validates them against the trainer's config tree, and
prints the dotted command line and the YAML file that ``--config`` reads. Light: no torch.
"""

from __future__ import annotations

import argparse
import codecs
import contextlib
import logging
import re
import shlex
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import yaml

from rlhf.errors import ConfigError, OneLineArgumentParser
from rlhf.launch import refused_settings, trainer_run
from rlhf_plugin_openrlhf_compat.tables import OPENRLHF_MODULES, TABLES
from rlhf_plugin_openrlhf_compat.translation import log as translation_log
from rlhf_plugin_openrlhf_compat.translation import shell_join, translate

log = logging.getLogger("rlhf.openrlhf_compat")

_MODULE = re.compile(r"(?:^|[./])openrlhf[./]cli[./](\w+?)(?:\.py)?$")
_SHELL_OPERATOR = re.compile(r"^[();<>|&]+$")
_ANSI_C_QUOTED = re.compile(r"\$'((?:[^'\\]|\\.)*)'")  # bash's $'User: {}\nAssistant: '

USAGE = """rlhf config convert [--yaml PATH] SCRIPT.sh
       rlhf config convert [--yaml PATH] [--trainer NAME] -- OPENRLHF COMMAND LINE…"""


@dataclass
class FoundCommand:
    """One OpenRLHF command: where it was found, the rlhf command words that replace it, and its flags."""

    where: str
    words: tuple[str, ...]
    argv: list[str]


CONFIG_HELP = "config tools: rlhf config convert SCRIPT.sh | -- OPENRLHF COMMAND (old flags -> dotted flags and YAML)"


def add_config_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """``rlhf config ACTION``: the one parser of the command, in ``rlhf --help``'s tree and run on its own."""
    config = sub.add_parser("config", help=CONFIG_HELP, description=CONFIG_HELP, allow_abbrev=False)
    actions = config.add_subparsers(dest="config_action", metavar="ACTION")
    convert = actions.add_parser(
        "convert", usage=USAGE, allow_abbrev=False, help="OpenRLHF command lines -> dotted flags and a YAML config",
        description="Translate OpenRLHF command lines (flat <= 0.9 flags, 0.11 README spellings) into today's dotted "
                    "flags and a YAML config for --config.")
    convert.add_argument("script", nargs="?", help="a shell script holding OpenRLHF commands ('-': stdin)")
    convert.add_argument("--trainer", help="the trainer of a bare flag list (ppo, sft, rm, dpo, kto, prm, kd)")
    convert.add_argument("--yaml", metavar="PATH", help="also write the YAML config here (PATH-2.yaml… for more commands)")
    return config


class ConfigCommand:
    """``rlhf config ACTION``: its own parser reads what follows ACTION (after ``--``: an old command line)."""

    help: ClassVar[str] = CONFIG_HELP

    @classmethod
    def add_arguments(cls, parser: Any) -> None:
        # one REMAINDER positional: argparse keeps the `--` that separates an old command line only there
        parser.add_argument("words", nargs=argparse.REMAINDER, metavar="ACTION ...",
                            help="convert: OpenRLHF command lines -> dotted flags and YAML (rlhf config convert --help)")

    def run(self, host: Any, args: Any) -> int:
        return run_config_command(host, args.words)


def run_config_command(host: Any, argv: list[str]) -> int:
    split = argv.index("--") if "--" in argv else len(argv)  # what follows `--` is an old command line, not ours
    args = add_config_parser(OneLineArgumentParser(prog="rlhf").add_subparsers()).parse_args(argv[:split])
    if args.config_action is None:
        raise ConfigError("rlhf config: give an action, e.g. rlhf config convert train.sh (see rlhf config --help)")
    command_line = argv[split + 1:]
    if bool(args.script) == bool(command_line):
        raise ConfigError(f"rlhf config convert: give a script or a command line after --, not {'both' if args.script else 'neither'}")
    if args.script:
        text = sys.stdin.read() if args.script == "-" else _read_script(args.script)
        found = commands_in_script(text, args.script)
        if not found:
            raise ConfigError(f"{args.script}: no OpenRLHF command (openrlhf.cli.…) or `rlhf train` line found")
    else:
        found = [_command_of(command_line, "the command line", args.trainer)]
    for index, command in enumerate(found):
        dotted, tree = convert(host, command)
        print(f"# {command.where}")
        print(f"rlhf {' '.join(command.words)} {shell_join(dotted)}".rstrip())
        if tree is not None:
            text = yaml.safe_dump(tree, sort_keys=False, allow_unicode=True)
            if args.yaml:
                path = Path(args.yaml)
                if index:
                    path = path.with_name(f"{path.stem}-{index + 1}{path.suffix}")
                path.write_text(text)
                print(f"# YAML config written to {path}: rlhf {' '.join(command.words)} --config {path}")
            else:
                print(f"# as a YAML config (rlhf {' '.join(command.words)} --config run.yaml):")
                print(text)
    return 0


def _read_script(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"rlhf config convert {path}: cannot read it ({exc.strerror})") from None


def commands_in_script(text: str, name: str) -> list[FoundCommand]:
    """Every OpenRLHF (or rlhf) command of a shell script, with backslash continuations joined."""
    found = []
    for line_number, line in _logical_lines(text):
        try:
            line = _ANSI_C_QUOTED.sub(lambda m: shlex.quote(codecs.decode(m.group(1), "unicode_escape")), line)
            lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
            lexer.whitespace_split = True
            lexer.commenters = "#"
            tokens = list(lexer)
        except ValueError:
            continue  # an unbalanced quote spanning lines: not a command we can read
        cut = next((i for i, token in enumerate(tokens) if _SHELL_OPERATOR.match(token)), len(tokens))
        command = _find_command(tokens[:cut], f"{name} line {line_number}")
        if command is not None:
            found.append(command)
    return found


def _logical_lines(text: str) -> list[tuple[int, str]]:
    lines, current, start = [], "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        if not current:
            start = number
        if raw.rstrip().endswith("\\"):
            current += raw.rstrip()[:-1] + " "
            continue
        lines.append((start, current + raw))
        current = ""
    if current:
        lines.append((start, current))
    return lines


def _find_command(tokens: list[str], where: str) -> FoundCommand | None:
    for position, token in enumerate(tokens):
        match = _MODULE.search(token)
        if match and match.group(1) in OPENRLHF_MODULES:
            return FoundCommand(f"{where}: openrlhf.cli.{match.group(1)}", OPENRLHF_MODULES[match.group(1)],
                                tokens[position + 1:])
        if Path(token).name == "rlhf" and position + 1 < len(tokens):
            rest = tokens[position + 1:]
            if rest[0] == "train" and len(rest) > 1:
                return FoundCommand(f"{where}: rlhf train {rest[1]}", ("train", rest[1]), rest[2:])
            if rest[0] in ("generate", "chat"):
                return FoundCommand(f"{where}: rlhf {rest[0]}", (rest[0],), rest[1:])
    return None


def _command_of(tokens: list[str], where: str, trainer: str | None) -> FoundCommand:
    command = _find_command(tokens, where)
    if command is not None:
        return command
    if trainer is None:
        raise ConfigError("rlhf config convert: the command line names no OpenRLHF module (openrlhf.cli.train_ppo_ray…); "
                          "pass --trainer NAME for a bare flag list")
    return FoundCommand(f"{where}: rlhf train {trainer}", ("train", trainer), tokens)


def convert(host: Any, command: FoundCommand) -> tuple[list[str], dict[str, Any] | None]:
    """Today's flags of one command, and (for trainers) the YAML tree of the options it sets."""
    if command.words[0] != "train":
        name = " ".join(command.words)  # the command's registered name: `generate`, `serve reward`
        return translate(command.argv, TABLES.get(name, {}), prog=f"rlhf {name}").argv, None
    with _unannounced():  # what was translated is this command's whole output, not a warning
        run = trainer_run(host, command.words[1], command.argv, refusing=False)
    for setting in refused_settings(run.config):  # the conversion stands; running it would stop here
        log.warning("%s: this runtime refuses %s", command.where, setting)
    return run.argv, run.given_tree()


@contextlib.contextmanager
def _unannounced() -> Iterator[None]:
    was = translation_log.disabled
    translation_log.disabled = True
    try:
        yield
    finally:
        translation_log.disabled = was
