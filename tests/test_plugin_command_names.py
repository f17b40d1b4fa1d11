"""Command names of several words: `rlhf serve tinker` beside `rlhf serve reward`, dispatched on the longest
registered name, with no plugin owning `serve` (docs/plugins/command.md)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlhf.cli.main import main
from rlhf.cli.plugin_cmd import longest_command

#: a private plugin with a one-word `serve` (as an older plugin would register it) and a three-word name
PLUGIN = '''
import rlhf

rlhf_plugin_api = 3


class Echo:
    help = "print the arguments"

    @classmethod
    def add_arguments(cls, parser):
        parser.add_argument("rest", nargs="*")

    def run(self, host, args):
        print("ran", args.rest)
        return 0


@rlhf.hookimpl
def rlhf_register_commands(register):
    register("serve", Echo, description="the old one-word serve")
    register("toolbox make thing", Echo, description="makes a thing")
'''


def test_the_longest_registered_name_wins() -> None:
    names = ["serve", "serve tinker", "serve reward", "generate"]
    assert longest_command(names, ["--debug", "serve", "tinker", "--port", "1"], 1) == ("serve tinker", 2)
    assert longest_command(names, ["serve", "other"], 0) == ("serve", 1)
    assert longest_command(names, ["serve", "--port", "1", "tinker"], 0) == ("serve", 1)  # the target comes next
    assert longest_command(names, ["serving"], 0) is None


@pytest.fixture
def plugin(tmp_path: Path) -> str:
    path = tmp_path / "echo_plugin.py"
    path.write_text(PLUGIN)
    return f"{path}"


def test_a_plugin_adds_a_target_beside_an_older_one_word_command(plugin: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as help_exit:  # the installed plugins load too: `serve tinker` is the longer name
        main(["--plugins", plugin, "serve", "tinker", "--help"])
    assert help_exit.value.code == 0 and "usage: rlhf serve tinker" in capsys.readouterr().out
    assert main(["--plugins", plugin, "serve", "x", "y"]) == 0
    assert "ran ['x', 'y']" in capsys.readouterr().out


def test_a_group_lists_its_targets_and_refuses_to_run_alone(plugin: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--plugins", plugin, "toolbox", "--help"]) == 0
    out = capsys.readouterr().out
    assert "usage: rlhf toolbox" in out and "make thing" in out and "makes a thing" in out
    assert main(["--plugins", plugin, "toolbox", "make", "thing", "a"]) == 0
    assert "ran ['a']" in capsys.readouterr().out
    assert main(["--plugins", plugin, "toolbox", "make"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["rlhf: error: rlhf toolbox make needs a target: one of thing (rlhf toolbox make --help)"]
    assert main(["--plugins", plugin, "toolbox", "break"]) == 2
    assert "rlhf 'toolbox break': no command of that name is installed" in capsys.readouterr().err


def test_serve_tinker_not_installed_names_its_distribution(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--plugins", "no:tinker-server", "serve", "tinker", "--port", "1"]) == 2
    err = capsys.readouterr().err
    assert "'serve tinker'" in err and "rlhf-plugin-tinker-server" in err
