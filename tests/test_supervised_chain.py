"""The classic pipeline on tiny models: SFT -> reward model (from the SFT model) -> PPO with that reward model."""

from __future__ import annotations

import json
import random

import pytest
import yaml
from rlhf_test_support import base_flags

from rlhf.cli.main import main
from rlhf.records.metrics import read_metrics
from rlhf.testing.cli import assert_ok, run_in_process

pytestmark = pytest.mark.slow


def _train(*args: str) -> None:
    """``rlhf train ARGS`` (one rank) in this process, as the PPO stage runs too."""
    assert_ok(run_in_process("train", *args))


def test_sft_then_rm_then_ppo(ray_cluster, task_files, tiny_causal_lm_path, tmp_path) -> None:
    """Each stage reads the one before: the RM (from the SFT model) stores a reward std > 0, and PPO with GAE trains
    2 steps with that RM, its critic starting from the RM and its actor from the SFT model."""
    rng = random.Random(0)
    sft_rows, pairs = tmp_path / "sft.jsonl", tmp_path / "pairs.jsonl"
    with sft_rows.open("w") as sft, pairs.open("w") as prefs:
        for _ in range(32):
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            sft.write(json.dumps({"input": f"what is {a}+{b}?", "output": str(a + b)}) + "\n")
            prefs.write(json.dumps({"prompt": f"what is {a}+{b}?", "chosen": str(a + b), "rejected": "no"}) + "\n")
    sft_model, reward_model = tmp_path / "sft", tmp_path / "rm"
    common = ["--data.apply_chat_template", "--train.batch_size", "8", "--train.micro_batch_size", "4",
              "--adam.lr", "1e-3", "--ds.param_dtype", "fp32"]
    _train("sft", "--model.model_name_or_path", str(tiny_causal_lm_path), "--data.dataset", str(sft_rows),
           "--ckpt.output_dir", str(sft_model), *common)
    _train("rm", "--model.model_name_or_path", str(sft_model), "--data.dataset", str(pairs), "--data.prompt_key", "prompt",
           "--eval.holdout", "0.25", "--ckpt.output_dir", str(reward_model), *common)
    stats = json.loads((reward_model / "config.json").read_text())
    assert stats["std"] > 0

    run = tmp_path / "ppo"
    flags = base_flags(sft_model, task_files["prompts"], run, "hf", steps=2)
    flags += ["--reward.model_name_or_path", str(reward_model), "--reward.normalize_enable",
              "--rollout.n_samples_per_prompt", "2", "--train.batch_size", "8", "--algo.advantage.estimator", "gae"]
    assert main(["train", "ppo", *flags]) == 0
    metrics = read_metrics(run / "out")
    assert [m["step"] for m in metrics] == [1, 2]
    assert all("critic_loss" in m and "reward" in m for m in metrics)
    recorded = yaml.safe_load((run / "out" / "rlhf_config.yaml").read_text())
    # OpenRLHF's rule: with gae and no critic path, the critic starts from the (first) reward model
    assert recorded["reward"]["model_name_or_path"] == recorded["critic"]["model_name_or_path"] == str(reward_model)
    assert recorded["actor"]["model_name_or_path"] == str(sft_model)
