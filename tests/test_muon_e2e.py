"""--actor.optim muon / --train.optim muon end to end: an RL run (DeepSpeed ZeRO-3, reduce-scatter off) and an SFT run
(FSDP2, the optimizer in plain torch)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from rlhf_test_support import base_flags
from safetensors.torch import load_file

from rlhf.cli.main import main
from rlhf.records.metrics import read_metrics
from rlhf.testing.cli import child_env

pytestmark = pytest.mark.slow


def changed_matrices(trained: Path, initial: Path) -> set[str]:
    before, after = load_file(initial / "model.safetensors"), load_file(trained / "model.safetensors")
    return {name for name, value in after.items() if name in before and not torch.equal(value, before[name])}


def test_grpo_trains_the_actor_with_muon_under_zero3(ray_cluster, task_files, tiny_causal_lm_path, tmp_path) -> None:
    flags = base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path, "hf", steps=2)
    flags += ["--reward.remote_url", str(task_files["reward"]), "--algo.advantage.estimator", "group_norm",
              "--rollout.n_samples_per_prompt", "2", "--train.batch_size", "8", "--algo.kl.init_coef", "0",
              "--actor.optim", "muon", "--actor.muon.lr", "0.01", "--actor.max_norm", "0", "--ds.zero_stage", "3"]
    assert main(["train", "ppo", *flags]) == 0
    metrics = read_metrics(tmp_path / "out")
    assert [m["step"] for m in metrics] == [1, 2] and all(torch.isfinite(torch.tensor(m["policy_loss"])) for m in metrics)
    changed = changed_matrices(tmp_path / "out", tiny_causal_lm_path)
    assert any("mlp.up_proj" in name for name in changed) and any("embed_tokens" in name for name in changed)


def test_sft_trains_with_muon_in_plain_torch_under_fsdp2_without_importing_deepspeed(tmp_path, tiny_causal_lm_path) -> None:
    """FSDP2 builds its own optimizer (the factory's ``build``): Muon+AdamW in plain torch, and the run's process
    never imports DeepSpeed (issue 61); the loss falls and the matrices move. DeepSpeed's Muon: the test above."""
    import subprocess
    import sys

    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"input": f"what is {a}+{a}?", "output": f" {2 * a}"}) + "\n" for a in range(32)))
    out = tmp_path / "out"
    probe = ("import sys, runpy; sys.argv = ['rlhf', 'train', 'sft', *sys.argv[1:]]\n"
             "try:\n    runpy.run_module('rlhf', run_name='__main__')\n"
             "except SystemExit as exit:\n    assert exit.code == 0, exit.code\n"
             "print('deepspeed modules:', sorted(m for m in sys.modules if m.partition('.')[0] == 'deepspeed'))")
    result = subprocess.run([sys.executable, "-c", probe, "--model.model_name_or_path", str(tiny_causal_lm_path),
                             "--data.dataset", str(data), "--train.batch_size", "8", "--train.micro_batch_size", "4",
                             "--train.max_epochs", "3", "--train.backend", "fsdp2", "--train.optim", "muon",
                             "--muon.lr", "0.02", "--adam.lr", "1e-3", "--ds.param_dtype", "fp32",
                             "--ckpt.output_dir", str(out)],
                            capture_output=True, text=True, timeout=600, env=child_env(RLHF_NO_PROGRESS="1", HF_HUB_OFFLINE="1"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "deepspeed modules: []" in result.stdout, result.stdout[-2000:]
    assert "--train.max_norm 1.0 with --train.optim muon" in result.stderr  # OpenRLHF's advice: no clipping with Muon
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines() if "loss" in line]
    assert losses[-1] < losses[0] - 0.5, losses
    assert any("mlp.up_proj" in name for name in changed_matrices(out, tiny_causal_lm_path))
