"""How the ``rlhf`` command ends when stopped: one line, status 128 + the signal; a preemption signal during a
training run checkpoints first (rlhf.records.preemption; the runs: tests/test_preemption.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rlhf.errors import ConfigError, Preempted
from rlhf.records import preemption
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


@pytest.fixture
def watching() -> Iterator[None]:
    """rlhf.records.preemption's handlers in this process for one test, then the handlers from before."""
    kept = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM)}
    yield
    signal.setitimer(signal.ITIMER_REAL, 0)
    for signum, handler in kept.items():
        signal.signal(signum, handler)
    preemption._watch = None


def test_preemption_signals_are_parsed_by_name_or_number_and_uncatchable_ones_are_refused() -> None:
    assert preemption.parse_signals(" TERM, SIGUSR1,12,SIGTERM") == (signal.SIGTERM, signal.SIGUSR1, 12)
    for text, says in (("SIGFOO", "'SIGFOO' is not a signal"), ("KILL", "SIGKILL cannot be used"),
                       ("SIGALRM", "SIGALRM cannot be used")):
        with pytest.raises(ConfigError, match=f"--ckpt.preemption_signals: {says}"):
            preemption.parse_signals(text)
    with pytest.raises(ConfigError, match="--ckpt.preemption_budget must be a positive number of seconds"):
        preemption.watch("SIGUSR1", 0)


def test_a_signal_before_the_first_step_stops_at_once(watching) -> None:
    preemption.watch("SIGUSR1", 60)
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(5)  # the handler raises as soon as the signal arrives
    assert preemption.stopped_because() == "before the first step finished, so nothing was written"
    assert preemption.first_signal() == signal.SIGUSR1 and preemption.pending() is None


def test_a_signal_after_a_step_saves_at_the_end_of_the_next_one_and_a_second_one_stops_at_once(watching,
                                                                                           tmp_path: Path) -> None:
    preemption.watch("SIGUSR1,SIGUSR2", 60)
    saved: list[int] = []
    preemption.step_done(1, lambda: saved.append(1) or tmp_path)  # no signal yet: nothing saved
    os.kill(os.getpid(), signal.SIGUSR2)  # mid-step 2: noted, the step goes on
    assert saved == [] and preemption.pending().signal == "SIGUSR2"
    assert 0 < signal.getitimer(signal.ITIMER_REAL)[0] <= 60  # the budget runs
    with pytest.raises(Preempted, match=rf"^\(SIGUSR2\) at step 2: checkpoint {tmp_path} written in \d+\.\d s; "):
        preemption.step_done(2, lambda: saved.append(2) or tmp_path)
    assert saved == [2] and signal.getitimer(signal.ITIMER_REAL)[0] == 0  # no alarm after the save
    with pytest.raises(KeyboardInterrupt):  # a second signal stops at once
        os.kill(os.getpid(), signal.SIGUSR1)
        time.sleep(5)
    assert preemption.stopped_because() == "a second signal (SIGUSR1) stopped the checkpoint, which was not kept"


def test_the_budget_running_out_stops_the_run_at_once(watching) -> None:
    preemption.watch("SIGUSR1", 0.2)
    preemption.step_done(1, lambda: Path("unused"))
    os.kill(os.getpid(), signal.SIGUSR1)
    with pytest.raises(KeyboardInterrupt):
        time.sleep(5)  # a step (or save) longer than the budget
    assert preemption.stopped_because() == ("the preemption budget of 0.2 s ran out before the checkpoint was written, "
                                            "so it was not kept")


def test_an_alarm_armed_by_someone_else_goes_to_its_own_handler(watching) -> None:
    """A test runner's timeout (pytest-timeout's SIGALRM) set before the run is not a preemption budget running out."""
    rang: list[int] = []
    signal.signal(signal.SIGALRM, lambda signum, frame: rang.append(signum))
    preemption.watch("SIGUSR1", 60)
    signal.setitimer(signal.ITIMER_REAL, 0.05)
    time.sleep(1)
    assert rang == [signal.SIGALRM] and preemption.stopped_because() == ""


def test_a_checkpoint_without_training_states_is_never_promised_a_resume(watching, tmp_path: Path) -> None:
    """Issue 61: under --ckpt.disable_ds a checkpoint holds no training states; the preemption line, the interrupt
    line and a failed run's advice say no run can resume from it, where they promise a resume for one that can."""
    import json

    from rlhf.records.checkpoints import resume_advice

    for states in (True, False):
        root = tmp_path / str(states)
        step = root / "global_step2"
        step.mkdir(parents=True)
        (step / "state.json").write_text(json.dumps({"step": 2, "models": {"actor": {"backend": "fsdp2", "states": states}}}))
        preemption.watch("SIGUSR2", 60)
        preemption.step_done(1, lambda step=step: step)
        os.kill(os.getpid(), signal.SIGUSR2)
        with pytest.raises(Preempted) as stopped:
            preemption.step_done(2, lambda step=step: step)
        preemption._watch = None
        lines = [str(stopped.value), str(interrupted(root)), resume_advice(root)]
        promise = "with the same command and --ckpt.load_enable"
        if states:
            assert all(promise in line for line in lines), lines
        else:
            assert all(promise not in line and "no training states (--ckpt.disable_ds), so no run can resume from it"
                       in line for line in lines), lines
