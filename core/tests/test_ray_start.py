"""The controller's start-up: Ray starting while torch/transformers import on a thread."""

from __future__ import annotations

import subprocess
import sys

# Ray "already running" (start_ray has nothing to wait for), then the controller's own work for a
# moment, then its tokenizer import. Without start_ray joining the import thread, transformers'
# half-initialised lazy module gives "cannot import name 'AutoTokenizer'" at 0.2-1 s here.
STARTUP = """
import time
import ray
from rlhf.runtime.ray_start import start_ray
ray.is_initialized = lambda: True
assert start_ray(import_meanwhile=("transformers.models.auto.tokenization_auto", "torch")) is False
time.sleep({delay})
from transformers import AutoTokenizer
print("imported", AutoTokenizer.__name__)
"""


def test_the_tokenizer_import_after_start_ray_never_meets_a_half_imported_transformers() -> None:
    for delay in (0.2, 0.5):
        done = subprocess.run([sys.executable, "-c", STARTUP.format(delay=delay)], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and "imported AutoTokenizer" in done.stdout, done.stderr[-2000:]


WORKER_NICENESS = """
import os
import ray
from rlhf.runtime.ray_start import start_ray

assert start_ray() is True
print("niceness", ray.get(ray.remote(num_cpus=0)(lambda: os.nice(0)).remote()))
ray.shutdown()
"""


def test_a_local_clusters_workers_run_at_normal_priority_unless_the_user_says_otherwise() -> None:
    """Ray's own default would start them at niceness 15, behind every other process on the machine."""
    import os

    for given, expected in ((None, 0), ("7", 7)):
        env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_worker_niceness")}
        if given is not None:
            env["RAY_worker_niceness"] = given
        done = subprocess.run([sys.executable, "-c", WORKER_NICENESS], capture_output=True, text=True, timeout=300, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        assert f"niceness {expected}" in done.stdout
