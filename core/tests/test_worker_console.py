"""``rlhf.console.configure_worker``, as a Ray worker process runs it when it starts: its stdout and stderr (C-level
writes included) go to the run log, and its ``rlhf.*`` warnings and every error to the stream Ray forwards to the
driver. Run in a fresh interpreter, since it redirects the process's own file descriptors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rlhf.console import ENV_RUN_LOG, ENV_VERBOSE
from rlhf.testing.cli import child_env

WORKER = """
import logging, os
from rlhf.console import configure_worker
configure_worker()
print("library print")
os.write(2, b"C-level stderr\\n")
logging.getLogger("rlhf.worker").warning("rlhf warning")
logging.getLogger("vllm").warning("library warning")
logging.getLogger("vllm").error("library error")
"""


def run_worker(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    inherited = {k: v for k, v in child_env().items() if k not in (ENV_RUN_LOG, ENV_VERBOSE)}  # not the test process's
    return subprocess.run([sys.executable, "-c", WORKER], capture_output=True, text=True, timeout=60,
                          env={**inherited, **env})


def test_a_workers_output_goes_to_the_run_log_and_only_rlhf_lines_and_errors_to_the_driver(tmp_path: Path) -> None:
    run_log = tmp_path / "run" / "rlhf.log"  # its folder does not exist yet, as on another node
    done = run_worker({ENV_RUN_LOG: str(run_log)})
    assert done.returncode == 0, done.stderr
    assert done.stdout == ""
    forwarded = done.stderr.splitlines()
    assert forwarded == ["WARNING rlhf.worker: rlhf warning", "ERROR vllm: library error"]
    logged = run_log.read_text()
    for line in ("library print", "C-level stderr", "rlhf warning", "library warning", "library error"):
        assert line in logged, (line, logged)


def test_a_verbose_worker_or_one_without_a_run_log_keeps_everything_on_the_forwarded_stream(tmp_path: Path) -> None:
    for env in ({ENV_RUN_LOG: str(tmp_path / "rlhf.log"), ENV_VERBOSE: "1"}, {}):
        done = run_worker(env)
        assert done.returncode == 0, done.stderr
        assert "library print" in done.stdout
        assert "C-level stderr" in done.stderr and "WARNING vllm: library warning" in done.stderr
    assert not (tmp_path / "rlhf.log").exists()
