"""Vision-language RL end to end: the colour-square task learns through the HF engine (Qwen2.5-VL-style)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlhf.cli.main import main
from rlhf.runtime.tracking import read_metrics
from rlhf.testing.tiny_vlm import colour_squares_task

pytestmark = pytest.mark.slow


def vlm_flags(model: Path, task: dict[str, Path], run: Path, episodes: int) -> list[str]:
    return ["--actor.model_name_or_path", str(model), "--data.prompt_dataset", str(task["prompts"]),
            "--data.label_key", "label", "--data.image_key", "images", "--data.max_images_per_prompt", "1",
            "--data.max_len", "64", "--train.num_episodes", str(episodes), "--rollout.batch_size", "8",
            "--rollout.max_new_tokens", "8", "--rollout.micro_batch_size", "16", "--rollout.n_samples_per_prompt", "8",
            "--train.batch_size", "64", "--train.micro_batch_size", "16", "--actor.adam.lr", "1e-2",
            "--actor.lr_warmup_ratio", "0", "--ds.param_dtype", "fp32", "--algo.advantage.estimator", "group_norm",
            "--algo.kl.init_coef", "0", "--reward.remote_url", str(task["reward"]), "--actor.num_gpus_per_node", "1",
            "--ckpt.output_dir", str(run / "out"), "--ckpt.path", str(run / "ckpt")]


def test_colour_task_reward_rises_through_the_hf_engine(ray_cluster, tiny_vlm_path, tmp_path) -> None:
    task = colour_squares_task(tmp_path / "task")
    assert main(["train", "ppo", *vlm_flags(tiny_vlm_path, task, tmp_path, episodes=4), "--vllm.num_engines", "0"]) == 0
    rewards = [m["reward"] for m in read_metrics(tmp_path / "out")]
    assert len(rewards) == 24
    first, last = sum(rewards[:3]) / 3, sum(rewards[-8:]) / 8
    assert last > first + 0.1, rewards
    trained, initial = load_file(tmp_path / "out" / "model.safetensors"), load_file(tiny_vlm_path / "model.safetensors")
    vision = [name for name in initial if name.startswith("visual.")]  # saved under the checkpoint's names
    assert vision and all(torch.equal(trained[name], initial[name]) for name in vision)  # frozen by default
    assert not torch.equal(trained["model.layers.0.mlp.up_proj.weight"], initial["model.layers.0.mlp.up_proj.weight"])


def test_colour_task_reward_rises_through_vllm_with_an_idefics3_model(ray_cluster, tiny_idefics3_path, tmp_path) -> None:
    task = colour_squares_task(tmp_path / "task")
    assert main(["train", "ppo", *vlm_flags(tiny_idefics3_path, task, tmp_path, episodes=4), "--vllm.num_engines", "1"]) == 0
    rewards = [m["reward"] for m in read_metrics(tmp_path / "out")]
    first, last = sum(rewards[:3]) / 3, sum(rewards[-8:]) / 8
    assert last > first + 0.1, rewards
