"""--train.dynamic_batch_enable and --ds.packing_samples in `rlhf train ppo`: however an optimizer step is
split into micro-batches, its update is the one of a single token mean over all of its tokens."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rlhf_test_support import base_flags
from safetensors.torch import load_file

from rlhf.cli.main import main

pytestmark = pytest.mark.slow


def one_step(run: Path, model: Path, task_files: dict[str, Path], *extra: str) -> dict[str, torch.Tensor]:
    flags = base_flags(model, task_files["prompts"], run, "hf", steps=1)
    # AdamW with a huge eps: its first step is lr·g/(|g|+eps), nearly linear in the gradient, so a wrong
    # normaliser shows in the weights (a plain first Adam step, lr·sign(g), would hide it)
    flags += ["--reward.remote_url", str(task_files["reward"]), "--algo.advantage.estimator", "group_norm",
              "--rollout.n_samples_per_prompt", "4", "--train.batch_size", "16", "--algo.kl.init_coef", "0",
              "--actor.adam.lr", "1e3", "--actor.adam.eps", "1e3", "--actor.lr_warmup_ratio", "0", "--actor.max_norm", "0",
              "--ds.attn_implementation", "eager", *extra]
    assert main(["train", "ppo", *flags]) == 0
    return load_file(run / "out" / "model.safetensors")


def test_fixed_dynamic_and_packed_micro_batches_make_the_same_update(ray_cluster, task_files, tiny_causal_lm_path,
                                                                     tmp_path) -> None:
    whole = one_step(tmp_path / "whole", tiny_causal_lm_path, task_files, "--train.micro_batch_size", "16")
    fixed = one_step(tmp_path / "fixed", tiny_causal_lm_path, task_files, "--train.micro_batch_size", "2")
    dynamic = one_step(tmp_path / "dynamic", tiny_causal_lm_path, task_files, "--train.micro_batch_size", "2",
                       "--train.dynamic_batch_enable", "--train.max_tokens_per_gpu", "100", "--ds.packing_samples")
    initial = load_file(tiny_causal_lm_path / "model.safetensors")
    moved = max((whole[name] - initial[name]).abs().max().item() for name in initial)
    assert moved > 1e-3  # the step moved the weights, so the comparisons mean something
    for name in initial:
        torch.testing.assert_close(fixed[name], whole[name], rtol=0, atol=2e-6, msg=f"fixed {name}")
        torch.testing.assert_close(dynamic[name], whole[name], rtol=0, atol=2e-6, msg=f"dynamic {name}")
