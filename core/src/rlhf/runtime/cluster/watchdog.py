"""Nothing of a run's own Ray cluster outlives the run, even when its driver is killed with SIGKILL.

Ray ties its head processes (GCS, raylet) to the driver with the parent-death signal, and the
workers follow their raylet; but the raylet's two agents (``ray::DashboardAgent`` and
``ray::RuntimeEnvAgent``, which Ray 2.60 always starts) notice the raylet's death and then try to
report it to the GCS, which is gone too: they lived 60-80 s after a SIGKILL of the driver. Neither
agent can be left out of a local cluster (the raylet refuses an empty agent command).

So the driver of a private local cluster starts this watchdog, a small process of its own (its own
session, so the terminal's Ctrl-C does not reach it) whose stdin is a pipe from the driver. When
the pipe closes (the driver stopped Ray, exited, or was killed) or the watchdog's parent changes,
it ends every process that holds a file of the cluster's session folder open: each Ray process
keeps its log files there open, whatever its process title says. SIGTERM first, SIGKILL for those
still there after :data:`GRACE_S`. A cluster the user started (``RAY_ADDRESS``) gets no watchdog.

Runs as ``python session_watchdog.py SESSION_DIR`` (stdlib only: it starts in milliseconds).
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

#: seconds between SIGTERM and SIGKILL for the processes of the session
GRACE_S = 3.0


class Watchdog:
    """The driver's side: the watchdog process and the pipe whose end means "the run is over"."""

    def __init__(self, session_dir: str) -> None:
        self.process = subprocess.Popen([sys.executable, __file__, session_dir], stdin=subprocess.PIPE,
                                        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)

    def stop(self, timeout_s: float = 30) -> None:
        """The run's Ray is shut down: end what is left of its session now, and wait for that."""
        self.process.stdin.close()
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:  # it goes on by itself; the driver does not wait longer
            pass


def session_processes(session_dir: str, skip: set[int]) -> list[int]:
    """Pids of the processes (but those in ``skip``) holding a file under ``session_dir`` open."""
    prefix = session_dir.rstrip("/") + "/"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        try:
            if any(os.readlink(fd).startswith(prefix) for fd in (entry / "fd").iterdir()):
                found.append(int(entry.name))
        except OSError:  # exited meanwhile, or not ours to look into
            continue
    return found


def end_session(session_dir: str, driver: int) -> None:
    """SIGTERM every process of the session, then SIGKILL those still there after :data:`GRACE_S`. The
    driver is spared: after a normal shutdown it is the one waiting for this (its core worker's log
    lies in the session folder too)."""
    spared = {os.getpid(), driver}
    for pid in session_processes(session_dir, spared):
        _signal(pid, signal.SIGTERM)
    deadline = time.monotonic() + GRACE_S
    while (left := session_processes(session_dir, spared)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        _signal(pid, signal.SIGKILL)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except OSError:  # gone already
        pass


def _wait_for_the_driver(driver: int) -> None:
    """Until stdin (the pipe from the driver) closes or the driver is no longer this process's parent."""
    while os.getppid() == driver:
        readable, _, _ = select.select([sys.stdin], [], [], 1.0)
        if readable and not os.read(sys.stdin.fileno(), 4096):
            return


if __name__ == "__main__":
    for ignored in (signal.SIGINT, signal.SIGHUP):  # a closed terminal takes the driver, not its cleanup
        signal.signal(ignored, signal.SIG_IGN)
    parent = os.getppid()
    _wait_for_the_driver(parent)
    end_session(sys.argv[1], parent)
