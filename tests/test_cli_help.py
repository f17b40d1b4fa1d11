"""Every command and action of ``rlhf`` answers ``--help`` with its help and exit status 0.

The commands are read from the CLI itself: the subcommand tree of ``build_parser()`` (with every action and
positional choice under it), the trainers behind ``rlhf train NAME`` and the commands plugins register, from
the same plugin registry the command dispatches with. A command added later is walked without editing this file.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from rlhf.cli.main import build_parser, main
from rlhf.host.plugin_host import PluginHost
from rlhf.host.selection import PluginSelection
from rlhf.registry import ComponentKind


def parser_commands(parser: argparse.ArgumentParser, words: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """``words`` and every command line below it: subcommands, and the choices of positional arguments."""
    yield words
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from parser_commands(child, (*words, name))
        elif not action.option_strings and action.choices:
            yield from ((*words, choice) for choice in action.choices)


def every_command() -> list[tuple[str, ...]]:
    host = PluginHost.load(PluginSelection.from_cli(None, False))
    registered = [("train", reg.name) for reg in host.registry.registrations(ComponentKind.TRAINER)]
    for reg in host.registry.registrations(ComponentKind.COMMAND):  # a plugin command's parser, as the CLI builds it
        parser = argparse.ArgumentParser(prog=f"rlhf {reg.name}")
        host.registry.get(ComponentKind.COMMAND, reg.name).add_arguments(parser)
        registered += parser_commands(parser, tuple(reg.name.split()))  # `serve reward` is typed as two words
    groups = {words[:1] for words in registered if len(words) > 1 and words[0] != "train"}  # `rlhf serve --help`
    builtin = [words for words in parser_commands(build_parser()) if words[:1] not in {(name,) for name, *_ in registered}]
    return [*builtin, *sorted(groups), *registered]


def help_of(words: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> tuple[object, str, str]:
    try:
        status: object = main([*words, "--help"])
    except SystemExit as exc:  # argparse's help exits
        status = exc.code
    out, err = capsys.readouterr()
    return status, out, err


def test_the_walk_finds_the_nested_actions() -> None:
    commands = every_command()
    for expected in [("config",), ("lora", "merge"), ("plugin", "new"), ("serve",), ("serve", "reward"), ("serve", "tinker"),
                     ("train", "ppo"), ("train", "sft")]:
        assert expected in commands


def test_every_command_and_action_answers_help(capsys: pytest.CaptureFixture[str]) -> None:
    failures = []
    for words in every_command():
        status, out, err = help_of(words, capsys)
        if status not in (0, None) or "usage:" not in out or "error" in err:
            failures.append(f"rlhf {' '.join(words)} --help: exit {status}, stderr {err.strip()[-300:]!r}")
    assert failures == []


def test_config_help_lists_its_actions(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = help_of(("config",), capsys)
    assert status == 0 and "usage: rlhf config" in out and "convert" in out
    status, out, _ = help_of(("config", "convert"), capsys)
    assert status == 0 and "usage: rlhf config convert" in out


def test_serve_lists_the_targets_plugins_register(capsys: pytest.CaptureFixture[str]) -> None:
    """`serve` is no plugin's command: `serve reward` and `serve tinker` are two plugins' two-word names."""
    status, out, _ = help_of(("serve",), capsys)
    assert status == 0 and "usage: rlhf serve" in out and "reward" in out and "tinker" in out
    status, out, _ = help_of((), capsys)
    assert "serve reward" in out and "serve tinker" in out
