"""Running the real ``rlhf`` command in a subprocess from tests, as a user would.

Trainers initialise torch.distributed and DeepSpeed process-wide, so tests run them in
their own process; this helper gives every such test the same clean environment. A refusal
found in the config (flags, config rules) needs no process of its own: :func:`refused_in_process`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rlhf.cli.main import main, split_plugin_args
from rlhf.distributed import GROUP_VARIABLES, restored_process
from rlhf.errors import render_exit
from rlhf.host.plugin_host import PluginHost
from rlhf.launch import trainer_run


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment without the group variables (a launcher's, or those of the one-rank group a test
    kit joined in this process), plus ``extra``: for any child that may join a process group."""
    env = {k: v for k, v in os.environ.items() if k not in GROUP_VARIABLES}
    env.update(extra)
    return env


def run_rlhf(*args: str, launcher: Sequence[str] = (), cwd: Path | None = None, timeout: float = 600,
             env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m rlhf ARGS`` (or ``python -m <launcher…> -m rlhf ARGS``), offline, without progress bars."""
    full_env = child_env(RLHF_NO_PROGRESS="1", HF_HUB_OFFLINE="1", **(env or {}))
    command = [sys.executable, "-m", *launcher, *(["-m"] if launcher else []), "rlhf", *args]
    return subprocess.run(command, capture_output=True, text=True, env=full_env, cwd=cwd, timeout=timeout)


def run_in_process(*argv: str) -> subprocess.CompletedProcess[str]:
    """``rlhf ARGV`` in this process, reported as :func:`run_rlhf` reports a child (exit status, stderr), without
    progress bars: for a run that is not about its process (one rank; RL on the session's Ray cluster), which then
    costs no interpreter, imports or cluster of its own.

    Afterwards this process is left as a child would leave it (:func:`rlhf.distributed.restored_process`), whatever
    the command: the trainers restore their process themselves, and a run of any other command may set variables
    for the libraries it drives (e.g. vLLM's), which a later child of the test would inherit."""
    import contextlib
    import io

    with restored_process():
        os.environ["RLHF_NO_PROGRESS"] = "1"
        with contextlib.redirect_stderr(io.StringIO()) as err:
            status = main(list(argv))
    return subprocess.CompletedProcess(list(argv), status, "", err.getvalue())


def assert_ok(result: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    """Fail with the end of stderr when the command did not exit 0."""
    assert result.returncode == 0, f"exit {result.returncode}:\n{result.stderr[-4000:]}"
    return result


def assert_user_error(result: subprocess.CompletedProcess[str], *names: str) -> str:
    """The command failed as a user mistake should: exit 2, no traceback, exactly one ``rlhf: error:``
    line, and that line names every one of ``names`` (the file, row, flag, plugin, URL…). Returns the line."""
    lines = [line for line in result.stderr.splitlines() if line.startswith("rlhf: error:")]
    assert result.returncode == 2, f"exit {result.returncode}, expected 2:\n{result.stderr[-4000:]}"
    assert "Traceback" not in result.stderr, f"a traceback was printed:\n{result.stderr[-4000:]}"
    assert len(lines) == 1, f"expected one 'rlhf: error:' line, got {len(lines)}:\n{result.stderr[-4000:]}"
    missing = [name for name in names if name not in lines[0]]
    assert not missing, f"the error line does not name {missing}: {lines[0]}"
    return lines[0]


def refused_in_process(capsys: Any, trainer: str, *argv: str,
                       then: Callable[[Any, Any], None] | None = None) -> subprocess.CompletedProcess[str]:
    """``rlhf train TRAINER ARGV`` in this process as far as its config (the CLI's plugin and flag parsing,
    the trainer's config rules), then ``then(config, host)``: it must be refused. The refusal as the CLI
    prints it (``render_exit``), for :func:`rlhf.testing.cli.assert_user_error`."""
    import pytest

    capsys.readouterr()
    try:
        selection, rest = split_plugin_args(list(argv))
        host = PluginHost.load(selection)
        config = trainer_run(host, trainer, rest).config
        if then is not None:
            then(config, host)
    except Exception as exc:  # noqa: BLE001 - rendered as the CLI renders it
        status = render_exit(exc, debug=False)
    else:
        pytest.fail(f"rlhf train {trainer} {' '.join(argv)} was not refused")
    return subprocess.CompletedProcess(argv, status, "", capsys.readouterr().err)
