"""Which Ray cluster a run uses: its own, unless ``RAY_ADDRESS`` names one. A ``ray_current_cluster`` file left
in Ray's temp folder by an earlier ``ray start`` (its cluster live or long gone) is never joined by accident:
``ray.init()`` without an address would join it, and then refuse the resources rlhf asks of a cluster it starts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from rlhf_test_support import base_flags

from rlhf.records.metrics import read_metrics
from rlhf.testing.cli import assert_ok, child_env


@pytest.fixture
def stale_ray_tmpdir() -> Iterator[tuple[Path, str]]:
    """A Ray temp folder (``RAY_TMPDIR``; short, for Ray's socket paths) whose ``ray/ray_current_cluster``
    names an address nobody answers at, as a stopped ``ray start`` cluster leaves it; the tests' own /tmp/ray
    is not touched."""
    folder = Path(tempfile.mkdtemp(prefix="rlhf-ray-", dir="/tmp"))
    address = "127.0.0.1:1"  # nobody answers there
    (folder / "ray").mkdir()
    (folder / "ray" / "ray_current_cluster").write_text(address + "\n")
    yield folder, address
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_a_run_on_ray_workers_starts_its_own_cluster_beside_a_stale_ray_start_record(
        stale_ray_tmpdir, tiny_causal_lm_path, task_files, tmp_path) -> None:
    folder, address = stale_ray_tmpdir
    env = child_env(RAY_TMPDIR=str(folder), HF_HUB_OFFLINE="1", RLHF_NO_PROGRESS="1")
    env.pop("RAY_ADDRESS", None)
    flags = [*base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path, "hf", steps=1),
             "--reward.remote_url", str(task_files["reward"]), "--algo.advantage.estimator", "group_norm",
             "--rollout.n_samples_per_prompt", "2", "--train.batch_size", "8", "--algo.kl.init_coef", "0",
             "--train.in_process", "off"]
    done = subprocess.run([sys.executable, "-m", "rlhf", "train", "ppo", *flags], capture_output=True, text=True,
                          timeout=600, env=env)
    assert_ok(done)
    assert [row["step"] for row in read_metrics(tmp_path / "out")] == [1]
    said = [line for line in done.stderr.splitlines() if "Ray" in line]
    assert len(said) == 1 and "started a Ray cluster of its own" in said[0] and address in said[0], done.stderr
    assert os.path.exists(folder / "ray" / "ray_current_cluster")  # the record is the user's: left as it was
