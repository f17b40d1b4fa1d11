"""Environment libraries as their authors wrote them, trained end to end from the commands of docs/environments.md.

reasoning-gym: its generators make each step's prompts (``--data.prompt_source``), its curriculum moves with the
scores, its scorer is the reward, and a resumed run makes the rows the straight one did. textarena: its games are
played one per episode in chat turns, and the game's end is the episode's."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rlhf_test_support import base_flags, crash_plugin

from rlhf.cli.main import main
from rlhf.records.metrics import read_metrics
from rlhf.records.rollouts import read_step

pytestmark = pytest.mark.slow

TASKS = "basic_arithmetic,chain_sum"


def sourced(model: Path, run: Path, steps: int) -> list[str]:
    """base_flags with the prompts from a source instead of a file."""
    files = base_flags(model, Path("unused.jsonl"), run, "hf", steps=steps)
    at = files.index("--data.prompt_dataset")
    return [*files[:at], *files[at + 2:]]


def flags(model: Path, run: Path) -> list[str]:
    return [*sourced(model, run, steps=3), "--data.prompt_source", "reasoning_gym", "--reasoning_gym.tasks", TASKS,
            "--reasoning_gym.curriculum", "true", "--reasoning_gym.raise_at", "0", "--reward.functions", "reasoning_gym",
            "--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "2", "--train.batch_size", "8",
            "--algo.kl.init_coef", "0", "--ckpt.save_steps", "1", "--rollout.dump_dir", str(run / "rollouts")]


def test_generated_tasks_train_level_up_and_resume_the_same_rows(ray_cluster, tiny_causal_lm_path, tmp_path) -> None:
    straight = tmp_path / "straight"
    assert main(["train", "ppo", *flags(tiny_causal_lm_path, straight)]) == 0
    steps = [read_step(straight / "rollouts", step) for step in (1, 2, 3)]
    questions = [row["prompt"] for row in steps[0]]
    assert len(questions) == 8 and all("<answer></answer>" in q for q in questions)
    assert len({row["prompt"] for step in steps for row in step}) == 12  # 4 new tasks a step, 2 samples each
    # raise_at 0: every batch raises both tasks' levels, and the checkpoint holds them
    levels = [json.loads((straight / "ckpt" / f"global_step{s}" / "state.json").read_text())["data"]["source"]["levels"]
              for s in (1, 2, 3)]
    assert levels == [dict.fromkeys(TASKS.split(","), level) for level in (1, 2, 3)]
    assert all(0.0 <= m["reward"] <= 1.0 for m in read_metrics(straight / "out"))

    resumed = tmp_path / "resumed"
    crash = str(crash_plugin(tmp_path, 2))
    assert main(["train", "ppo", "--plugins", crash, *flags(tiny_causal_lm_path, resumed)]) == 2
    assert main(["train", "ppo", *flags(tiny_causal_lm_path, resumed), "--ckpt.load_enable"]) == 0
    assert [row["prompt"] for row in read_step(resumed / "rollouts", 3)] == [row["prompt"] for row in steps[2]]
    assert read_metrics(resumed / "out")[-1]["reward"] == pytest.approx(read_metrics(straight / "out")[-1]["reward"])


def test_a_textarena_game_trains_one_game_per_episode_in_chat_turns(ray_cluster, tiny_causal_lm_path, tmp_path) -> None:
    run = tmp_path / "arena"
    common = sourced(tiny_causal_lm_path, run, steps=1)
    common[common.index("--data.max_len") + 1] = "512"  # the game's own prompt is ~390 tokens of the tiny tokenizer
    at = common.index("--data.label_key")
    common = [*common[:at], *common[at + 2:]]  # a game has no label: the game says how it ended
    assert main(["train", "ppo", *common, "--data.prompt_source", "textarena", "--train.agent_executor", "textarena",
                 "--textarena.env_id", "GuessTheNumber-v0", "--algo.advantage.estimator", "group_norm",
                 "--rollout.n_samples_per_prompt", "2", "--train.batch_size", "8", "--algo.kl.init_coef", "0",
                 "--rollout.dump_dir", str(run / "rollouts")]) == 0
    rows = read_step(run / "rollouts", 1)
    assert len(rows) == 8 and all("You are playing Guess The Number" in row["prompt"] for row in rows)
    for row in rows:  # the game's replies are user turns in the tiny template, never trained on
        assert "<|user|>" in row["response"] and 0 in row["action_mask"] and 1 in row["action_mask"]
        # 512 tokens hold a few moves of the untrained model, not the game's 10: cut, so no reward and not "done"
        assert row["finish_reason"] == "length" and row["reward"] == 0.0
    (metrics,) = read_metrics(run / "out")
    assert metrics["truncated_ratio"] == 1.0 and metrics["response_length"] > 20
