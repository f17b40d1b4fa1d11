"""The two steering examples of docs/hooks.md (docs/plugins/examples) steer real runs on the tiny task."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rlhf_test_support import base_flags, crash_plugin

from rlhf.cli.main import main
from rlhf.records.metrics import read_metrics

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "plugins" / "examples"
GRPO = ["--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "2", "--train.batch_size", "8",
        "--algo.kl.init_coef", "0", "--ckpt.save_steps", "2"]


def split_task(prompts: Path, directory: Path) -> str:
    """The task's prompts as two datasets, "easy" (sums) and "hard" (the same, asked as products)."""
    rows = [json.loads(line) for line in prompts.read_text().splitlines()]
    easy, hard = directory / "easy.jsonl", directory / "hard.jsonl"
    easy.write_text("".join(json.dumps(r) + "\n" for r in rows))
    hard.write_text("".join(json.dumps({**r, "input": r["input"].replace("+", "*")}) + "\n" for r in rows))
    return f"{easy},{hard}"


def test_a_curriculum_shifts_the_prompt_mix_and_a_resumed_run_continues_it(ray_cluster, task_files, tiny_causal_lm_path,
                                                                          tmp_path) -> None:
    datasets = split_task(task_files["prompts"], tmp_path)

    def flags(run: Path) -> list[str]:
        return [*base_flags(tiny_causal_lm_path, task_files["prompts"], run, "hf", steps=4), *GRPO,
                "--reward.remote_url", str(task_files["reward"]), "--data.prompt_dataset", datasets,
                "--data.prompt_probs", "0.5,0.5", "--reward_curriculum.reward_threshold", "0",
                "--reward_curriculum.shift", "0.25"]

    curriculum = str(EXAMPLES / "reward_curriculum.py")
    assert main(["train", "ppo", "--plugins", curriculum, *flags(tmp_path / "straight")]) == 0
    straight = read_metrics(tmp_path / "straight" / "out")
    # each step moves 0.25 of the weight to "hard" until it has it all; then the plugin has nothing to do
    assert [m.get("steer/prompt_weight/1") for m in straight] == [0.75, 1.0, None, None]
    assert [m["prompt_mix/1"] for m in straight][2:] == [1.0, 1.0]  # drawn by the steered weights
    assert straight[0]["prompt_mix/0"] + straight[0]["prompt_mix/1"] == 1.0

    crash = str(crash_plugin(tmp_path, 2))
    assert main(["train", "ppo", "--plugins", f"{curriculum},{crash}", *flags(tmp_path / "resumed")]) == 2
    state = json.loads((tmp_path / "resumed" / "ckpt" / "global_step2" / "state.json").read_text())
    assert state["data"]["weights"] == [0.0, 1.0]
    assert main(["train", "ppo", "--plugins", curriculum, *flags(tmp_path / "resumed"), "--ckpt.load_enable"]) == 0
    resumed = read_metrics(tmp_path / "resumed" / "out")
    assert [m["step"] for m in resumed] == [1, 2, 3, 4]
    for before, after in zip(straight, resumed):
        for key in ("prompt_mix/0", "prompt_mix/1", "reward"):
            assert after[key] == pytest.approx(before[key], rel=1e-5, abs=1e-6), (after["step"], key)


def test_an_early_stop_ends_a_run_whose_reward_plateaus(ray_cluster, task_files, tiny_causal_lm_path, tmp_path,
                                                        capsys) -> None:
    flags = [*base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path, "hf", steps=6), *GRPO,
             "--reward.remote_url", str(task_files["reward"]), "--early_stop.patience", "2",
             "--early_stop.min_delta", "100"]  # no step can beat the first by 100: a plateau from step 1 on
    coefficients = tmp_path / "coefficients.py"  # beside it, a plugin that sets two coefficients after step 1
    coefficients.write_text("import rlhf\n\nrlhf_plugin_api = rlhf.PLUGIN_API_VERSION\n\n\n@rlhf.hookimpl\n"
                            "def rlhf_steer(step, steering):\n    if step == 1:\n"
                            "        steering.set_coefficient('kl', 0.05)\n        steering.set_coefficient('entropy', 0.01)\n")
    assert main(["train", "ppo", "--plugins", f"{EXAMPLES / 'early_stop.py'},{coefficients}", *flags]) == 0
    metrics = read_metrics(tmp_path / "out")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert [m["kl_coef"] for m in metrics] == [0.0, 0.05, 0.05] and metrics[0]["steer/kl"] == 0.05
    assert ["entropy" in m for m in metrics] == [False, True, True]  # the actor adds the entropy term from step 2
    assert [m.get("steer/stop") for m in metrics] == [None, None, 1.0]
    status = json.loads((tmp_path / "out" / "run_status.json").read_text())
    assert status["status"] == "stopped" and status["step"] == 3
    assert status["reason"].startswith("plugin 'early_stop': reward plateaued")
    assert (tmp_path / "out" / "model.safetensors").is_file()  # saved as a finished run is
    assert "step 3: plugin 'early_stop' asked to stop: reward plateaued" in capsys.readouterr().out
