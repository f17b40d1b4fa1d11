"""The controller's start-up: Ray starting while torch/transformers import on a thread."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# Ray "already running" (start_ray has nothing to wait for), then the controller's own work for a
# moment, then its tokenizer import. Without start_ray joining the import thread, transformers'
# half-initialised lazy module gives "cannot import name 'AutoTokenizer'" at 0.2-1 s here.
STARTUP = """
import time
import ray
from rlhf.runtime.cluster.ray_start import start_ray
ray.is_initialized = lambda: True
assert start_ray(import_meanwhile=("transformers.models.auto.tokenization_auto", "torch")) is False
time.sleep({delay})
from transformers import AutoTokenizer
print("imported", AutoTokenizer.__name__)
"""


@pytest.mark.slow
def test_the_tokenizer_import_after_start_ray_never_meets_a_half_imported_transformers() -> None:
    for delay in (0.2, 0.5):
        done = subprocess.run([sys.executable, "-c", STARTUP.format(delay=delay)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and "imported AutoTokenizer" in done.stdout, done.stderr[-2000:]


WORKER_NICENESS = """
import os
import ray
from rlhf.runtime.cluster.ray_start import start_ray

assert start_ray() is True
print("niceness", ray.get(ray.remote(num_cpus=0)(lambda: os.nice(0)).remote()))
ray.shutdown()
"""


@pytest.mark.slow
def test_a_local_clusters_workers_run_at_normal_priority_unless_the_user_says_otherwise() -> None:
    """Ray's own default would start them at niceness 15, behind every other process on the machine."""
    for given, expected in ((None, 0), ("7", 7)):
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_worker_niceness")}
        if given is not None:
            env["RAY_worker_niceness"] = given
        done = subprocess.run([sys.executable, "-c", WORKER_NICENESS], capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        assert f"niceness {expected}" in done.stdout


# start_ray beside Ray's record of an earlier `ray start` (RAY_TMPDIR/ray/ray_current_cluster), then the cluster it is on
BESIDE_A_RECORD = """
import logging
import ray
from rlhf.runtime.cluster.ray_start import start_ray, stop_ray

logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
assert start_ray() is True
print("CPUs", ray.cluster_resources()["CPU"], flush=True)  # what rlhf gives a cluster of its own
stop_ray()
"""


@pytest.mark.slow
def test_a_cluster_recorded_by_an_earlier_ray_start_is_not_joined_by_accident(tmp_path: Path) -> None:
    """A bare ray.init() joins the cluster in Ray's ray_current_cluster file (here a dead one), and then refuses the
    num_cpus rlhf gives a cluster it starts: a run starts its own and says so in one line."""
    folder = Path(tempfile.mkdtemp(prefix="rlhf-ray-", dir="/tmp"))  # short: Ray's socket paths
    try:
        (folder / "ray").mkdir()
        (folder / "ray" / "ray_current_cluster").write_text("127.0.0.1:1\n")
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        done = subprocess.run([sys.executable, "-c", BESIDE_A_RECORD], capture_output=True, text=True, timeout=300,
                              env={**env, "RAY_TMPDIR": str(folder)})
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"CPUs {float(os.cpu_count())}" in done.stdout
    said = [line for line in done.stderr.splitlines() if line.startswith(("INFO rlhf", "WARNING rlhf"))]
    assert said == [f"WARNING rlhf.runtime: started a Ray cluster of its own, not the one an earlier `ray start` "
                    f"recorded in {folder}/ray/ray_current_cluster (127.0.0.1:1, live or not): RAY_ADDRESS=auto (or "
                    "its address) runs on that one"], done.stderr[-2000:]


# A driver of its own local cluster, with one actor running; it prints the cluster's session folder, then waits
# to be killed, or with "stop" shuts its Ray down and says so.
DRIVER = """
import os, sys, time
import ray
from rlhf.runtime.cluster.ray_start import start_ray, stop_ray

assert start_ray() is True
worker = ray.remote(num_cpus=0)(type("Idle", (), {"pid": lambda self: os.getpid()})).remote()
ray.get(worker.pid.remote())
print(ray._private.worker._global_node.get_session_dir_path(), flush=True)
if sys.argv[1] == "stop":
    stop_ray()
    print("stopped", flush=True)
time.sleep(600)
"""


def _holding_files_under(folder: str, but: int = 0) -> list[str]:
    """The processes (but ``but``) that hold a file under ``folder`` open (every Ray process keeps its logs
    open there, whatever its process title says), with their titles."""
    from rlhf.runtime.cluster.watchdog import session_processes

    found = []
    for pid in session_processes(folder, {os.getpid(), but}):
        try:
            title = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")[:120]
            found.append(f"{pid}: {title!r}")
        except OSError:  # exited meanwhile
            continue
    return found


@pytest.fixture
def driver(tmp_path: Path) -> Iterator[Callable[[str], tuple[subprocess.Popen, str]]]:
    started: list[subprocess.Popen] = []
    folders: list[str] = []

    def start(mode: str) -> tuple[subprocess.Popen, str]:
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        env["RAY_TMPDIR"] = tempfile.mkdtemp(prefix="rlhf-ray-", dir="/tmp")  # short: Ray's socket paths
        folders.append(env["RAY_TMPDIR"])
        process = subprocess.Popen([sys.executable, "-c", DRIVER, mode], stdout=subprocess.PIPE, text=True, env=env,
                                   stderr=(tmp_path / "driver.err").open("w"))
        started.append(process)
        session = process.stdout.readline().strip()
        assert session, (tmp_path / "driver.err").read_text()[-3000:]
        return process, session

    yield start
    for process in started:
        process.kill()
        process.wait()
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_nothing_of_a_local_cluster_outlives_its_driver_killed_with_sigkill(driver) -> None:
    """Ray's DashboardAgent and RuntimeEnvAgent lived 60-80 s after their driver's SIGKILL (reporting the
    raylet's death to a GCS that is gone too); the run's watchdog ends them at once."""
    process, session = driver("wait")
    assert any("DashboardAgent" in p for p in _holding_files_under(session))
    process.send_signal(signal.SIGKILL)
    process.wait()
    deadline = time.monotonic() + 30  # far more than the watchdog needs, far less than the agents lived without it
    while (left := _holding_files_under(session)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert left == []


@pytest.mark.slow
def test_stop_ray_leaves_nothing_of_the_local_cluster(driver) -> None:
    process, session = driver("stop")
    assert process.stdout.readline().strip() == "stopped"
    assert process.poll() is None  # the driver itself is spared (its core worker's log is in the folder too)
    assert _holding_files_under(session, but=process.pid) == []  # gone when stop_ray returns
