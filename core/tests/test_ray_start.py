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

