"""The controller's start-up: Ray starting while torch/transformers import on a thread; start_ray's local cluster and stop_ray."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
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


# A driver of its own local cluster, started beside Ray's record of an earlier `ray start`
# (RAY_TMPDIR/ray/ray_current_cluster), with one actor running. It prints the cluster's CPUs, its session folder and the
# niceness of the actor's worker process, then shuts its Ray down, says so, and waits to be killed.
DRIVER = """
import logging, os, time
import ray
from rlhf.runtime.cluster.ray_start import start_ray, stop_ray

logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
assert start_ray() is True
print("CPUs", ray.cluster_resources()["CPU"], flush=True)  # what rlhf gives a cluster of its own
worker = ray.remote(num_cpus=0)(type("Idle", (), {"niceness": lambda self: os.nice(0)})).remote()
niceness = ray.get(worker.niceness.remote())
print(ray._private.worker._global_node.get_session_dir_path(), flush=True)
print("niceness", niceness, flush=True)
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


@pytest.mark.slow
def test_start_ray_beside_an_earlier_record_at_the_users_niceness_and_stop_ray_leaves_nothing(tmp_path: Path) -> None:
    """start_ray's local cluster, one driver for three behaviours (a cluster start each would cost 5-7 CPU-s):
    - beside the record of an earlier `ray start` (here a dead one): a bare ray.init() would join it, and then refuse
      the num_cpus rlhf gives a cluster it starts; start_ray starts its own, with every CPU, and says so in one line;
    - its workers run at the niceness the user set with RAY_worker_niceness (without it, at normal priority,
      niceness 0, where Ray's own default is 15: asserted on a run's own cluster by tests/test_multi_node.py's killed
      runs, as is that nothing of a local cluster outlives its driver killed with SIGKILL);
    - stop_ray ends every process of the cluster, and spares the driver."""
    folder = Path(tempfile.mkdtemp(prefix="rlhf-ray-", dir="/tmp"))  # short: Ray's socket paths
    (folder / "ray").mkdir()
    (folder / "ray" / "ray_current_cluster").write_text("127.0.0.1:1\n")
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_worker_niceness")}
    errors = tmp_path / "driver.err"
    process = subprocess.Popen([sys.executable, "-c", DRIVER], stdout=subprocess.PIPE, text=True, stderr=errors.open("w"),
                               env={**env, "RAY_TMPDIR": str(folder), "RAY_worker_niceness": "7"})
    try:
        assert process.stdout.readline().strip() == f"CPUs {float(os.cpu_count())}", errors.read_text()[-3000:]
        session = process.stdout.readline().strip()
        assert process.stdout.readline().strip() == "niceness 7"
        assert process.stdout.readline().strip() == "stopped"
        assert process.poll() is None  # the driver itself is spared (its core worker's log is in the folder too)
        assert _holding_files_under(session, but=process.pid) == []  # gone when stop_ray returns
        said = [line for line in errors.read_text().splitlines() if line.startswith(("INFO rlhf", "WARNING rlhf"))]
        assert said == [f"WARNING rlhf.runtime: started a Ray cluster of its own, not the one an earlier `ray start` "
                        f"recorded in {folder}/ray/ray_current_cluster (127.0.0.1:1, live or not): RAY_ADDRESS=auto (or "
                        "its address) runs on that one"], errors.read_text()[-2000:]
    finally:
        process.kill()
        process.wait()
        shutil.rmtree(folder, ignore_errors=True)
