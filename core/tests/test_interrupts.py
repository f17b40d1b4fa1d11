"""How the ``rlhf`` command ends when stopped: SIGTERM as Ctrl-C, one line, status 128 + the signal."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from rlhf.records.checkpoints import interrupted

# A plugin command that says it is running, then waits to be stopped.
WAITER = '''
import pathlib, time
import rlhf
rlhf_plugin_api = rlhf.PLUGIN_API_VERSION

class Wait:
    help = "wait to be stopped"

    @classmethod
    def add_arguments(cls, parser):
        parser.add_argument("flag_file")

    def run(self, host, args):
        pathlib.Path(args.flag_file).touch()
        time.sleep(120)
        return 0

@rlhf.hookimpl
def rlhf_register_commands(register):
    register("wait", Wait, description=Wait.help)
'''


def test_sigterm_ends_the_command_with_one_interrupted_line_and_status_143(tmp_path: Path) -> None:
    plugin, running = tmp_path / "waiter.py", tmp_path / "running"
    plugin.write_text(WAITER)
    command = subprocess.Popen([sys.executable, "-m", "rlhf", "--plugins", str(plugin), "wait", str(running)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not running.exists() and command.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert command.poll() is None, command.communicate()[1][-3000:]
        command.send_signal(signal.SIGTERM)
        _, stderr = command.communicate(timeout=60)
    finally:
        command.kill()
    assert command.returncode == 143, stderr[-3000:]  # a shell's 128 + 15, not -15 (killed) or 134 (aborted)
    assert stderr.strip().splitlines() == ["rlhf: interrupted (SIGTERM)"]


def test_an_interrupted_run_names_its_last_checkpoint_or_says_there_is_none(tmp_path: Path) -> None:
    root = tmp_path / "ckpt"
    assert str(interrupted(root)) == (f"no checkpoint was written under {root}, so a new run starts from step 0 "
                                      "(--ckpt.save_steps N writes one every N steps)")
    for step in (2, 10):
        (root / f"global_step{step}").mkdir(parents=True)
    (root / ".staging-global_step12").mkdir()  # a save cut short is no checkpoint
    assert str(interrupted(root)) == (f"the last checkpoint is step 10 ({root / 'global_step10'}): resume with the same "
                                      "command and --ckpt.load_enable")
