"""Model ranks in the controller's process (``--train.in_process``): the same training as with Ray workers,
without a Ray cluster, and a run that needs Ray is not squeezed into one process."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from rlhf_test_support import base_flags

from rlhf.cli.main import main
from rlhf.records.metrics import read_metrics

pytestmark = pytest.mark.slow

#: what two placements of the same seeded run must agree on, step by step
SAME = ("reward", "response_length", "policy_loss", "actor_lr", "kl_loss", "advantage_mean")


def run(tmp_path: Path, name: str, tiny_causal_lm_path: Path, task_files: dict[str, Path], *extra: str) -> list[dict]:
    flags = [*base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path / name, "hf", steps=3),
             "--reward.remote_url", str(task_files["reward"]), "--algo.advantage.estimator", "group_norm",
             "--rollout.n_samples_per_prompt", "4", "--train.batch_size", "16", "--algo.kl.init_coef", "0.01",
             "--algo.kl.estimator", "k3", "--algo.kl.use_loss", *extra]
    assert main(["train", "ppo", *flags]) == 0
    return read_metrics(tmp_path / name / "out")


def test_ranks_in_this_process_train_the_steps_ray_workers_train(ray_cluster, tiny_causal_lm_path, task_files,
                                                                 tmp_path) -> None:
    """Actor and reference in this process (auto: one rank each, HF generate in the actor's rank) give the
    metrics of every step that the same run gives on Ray workers; no Ray is started for it.

    An in-process vLLM engine's shutdown destroys torch's default process group; the next in-process run of the
    same process (tests, notebooks) makes a new one and trains, on DeepSpeed too, from the same first step."""
    import torch

    rank_variables = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "DS_ACCELERATOR")
    before = {key: os.environ.get(key) for key in rank_variables}
    local = run(tmp_path, "local", tiny_causal_lm_path, task_files)
    assert {key: os.environ.get(key) for key in rank_variables} == before  # what the ranks set is gone again
    where = json.loads((tmp_path / "local" / "out" / "workers.json").read_text())
    assert [(w["group"], w["in_process"], w["pid"]) for w in where] == [("actor", True, os.getpid()),
                                                                        ("ref", True, os.getpid())]
    torch.distributed.destroy_process_group()  # what vLLM's engine shutdown does
    assert run(tmp_path, "after-destroy", tiny_causal_lm_path, task_files)[0]["reward"] == pytest.approx(local[0]["reward"])
    on_ray = run(tmp_path, "ray", tiny_causal_lm_path, task_files, "--train.in_process", "off")
    assert {w["group"] for w in json.loads((tmp_path / "ray" / "out" / "workers.json").read_text())} == {"actor", "ref"}
    assert len(local) == len(on_ray) == 3
    for ours, theirs in zip(local, on_ray):
        for key in SAME:
            assert ours[key] == pytest.approx(theirs[key], rel=1e-4, abs=1e-6), (ours["step"], key)
    assert local[-1]["reward"] != local[0]["reward"] or local[-1]["policy_loss"] != local[0]["policy_loss"]


def test_a_run_in_one_process_imports_no_ray(tiny_causal_lm_path, task_files, tmp_path) -> None:
    """What the saving is made of: the command never imports Ray, so no cluster, no worker processes."""
    import subprocess

    flags = [*base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path, "hf", steps=1),
             "--reward.remote_url", str(task_files["reward"]), "--algo.advantage.estimator", "group_norm",
             "--rollout.n_samples_per_prompt", "4", "--train.batch_size", "16", "--algo.kl.init_coef", "0"]
    probe = ("import sys, runpy; sys.argv = ['rlhf', 'train', 'ppo', *sys.argv[1:]]\n"
             "try:\n    runpy.run_module('rlhf', run_name='__main__')\n"
             "except SystemExit as exit:\n    assert exit.code == 0, exit.code\n"
             "print('ray imported:', 'ray' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", probe, *flags], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ray imported: False" in result.stdout, result.stdout[-2000:]
