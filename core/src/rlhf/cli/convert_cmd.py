"""``rlhf config convert``: an OpenRLHF command line or shell script -> today's dotted command and a YAML config.

Finds every OpenRLHF command in a script (``deepspeed --module openrlhf.cli.train_sft …``,
``ray job submit … -- python3 -m openrlhf.cli.train_ppo_ray …``, the examples' ``read -d '' … <<EOF``
blocks, or ``rlhf train NAME …``), translates its flags with the tables of
:mod:`rlhf.config.openrlhf_legacy`, validates them against the trainer's config tree, and
prints the dotted command line and the YAML file that ``--config`` reads. Light: no torch.
"""

from __future__ import annotations

import argparse
import codecs
import logging
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from rlhf.config.cli_bridge import nest
from rlhf.config.legacy_translation import shell_join, table_for_config, translate
from rlhf.config.loading import META_DESTS, ConfigParser
from rlhf.config.openrlhf_legacy import OPENRLHF_MODULES, TABLES
from rlhf.config.refused import refused_settings
from rlhf.errors import ConfigError, OneLineArgumentParser
from rlhf.host.plugin_host import PluginHost
from rlhf.registry import ComponentKind

log = logging.getLogger("rlhf.config")

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


def run_config_command(host: PluginHost, argv: list[str]) -> int:
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


def convert(host: PluginHost, command: FoundCommand) -> tuple[list[str], dict[str, Any] | None]:
    """Today's flags of one command, and (for trainers) the YAML tree of the options it sets."""
    if command.words[0] != "train":
        return translate(command.argv, TABLES.get(command.words[0], {}), prog=f"rlhf {command.words[0]}").argv, None
    trainer_cls = host.registry.get(ComponentKind.TRAINER, command.words[1], flag="rlhf train")
    parser = ConfigParser(trainer_cls.config_class, host, prog=f"rlhf train {command.words[1]}")
    known = [*parser.flags, *(s for action in parser.parser._actions for s in action.option_strings)]
    dotted = translate(command.argv, table_for_config(trainer_cls.config_class), known=known, prog=parser.parser.prog).argv
    config, namespace = parser.parse(dotted, refusing=False)
    for setting in refused_settings(config):  # the conversion stands; running it would stop here
        log.warning("%s: this runtime refuses %s", command.where, setting)
    dump = config.model_dump(mode="json")
    given = [key for key in vars(namespace) if key not in META_DESTS]
    return dotted, nest({key: _value_at(dump, key) for key in given})


def _value_at(tree: dict[str, Any], dotted: str) -> Any:
    for part in dotted.split("."):
        tree = tree[part]
    return tree
