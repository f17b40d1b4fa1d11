"""The reasoning-gym source and reward against the library itself: rows by position, levels by score, its scorer."""

from __future__ import annotations

import pytest
from rlhf_plugin_reasoning_gym.scoring import ReasoningGymScore
from rlhf_plugin_reasoning_gym.tasks import ReasoningGymOptions, ReasoningGymTasks

from rlhf.components import PromptOutcome, PromptSource
from rlhf.errors import ConfigError, DataError
from rlhf.testing.conformance import PromptSourceKit, ppo_config


def source(**options) -> ReasoningGymTasks:
    return ReasoningGymTasks(ReasoningGymOptions(**options), seed=3, input_key="question", label_key="answer")


def test_a_row_depends_on_its_position_and_the_seed_only() -> None:
    tasks = source(tasks="basic_arithmetic,chain_sum")
    assert isinstance(tasks, PromptSource)
    rows = tasks.rows(0, 12)
    assert tasks.rows(5, 3) == rows[5:8]
    assert {row["reasoning_gym"]["metadata"]["source_dataset"] for row in rows} == {"basic_arithmetic", "chain_sum"}
    assert all(row["question"].endswith("inside <answer></answer>.") and row["answer"] for row in rows)
    other = ReasoningGymTasks(ReasoningGymOptions(tasks="basic_arithmetic,chain_sum"), 4, "question", "answer")
    assert other.rows(0, 12) != rows


def test_the_curriculum_moves_one_level_by_each_batchs_mean_score_and_resumes() -> None:
    tasks = source(tasks="basic_arithmetic", curriculum=True)
    easy = tasks.rows(0, 4)

    def scored(rows, score):
        tasks.observe([PromptOutcome(position, row, (score, score)) for position, row in enumerate(rows)])

    scored(easy, 1.0)
    scored(easy, 0.9)
    assert tasks.state() == {"levels": {"basic_arithmetic": 2}}
    harder = tasks.rows(0, 4)  # the same positions, at a higher level: longer expressions
    assert [r["reasoning_gym"]["metadata"]["num_terms"] for r in harder] >= [2] * 4
    assert max(r["reasoning_gym"]["metadata"]["num_terms"] for r in harder) > max(
        r["reasoning_gym"]["metadata"]["num_terms"] for r in easy)
    scored(harder, 0.5)  # between lower_at and raise_at: stays
    scored(harder, 0.0)
    assert tasks.state() == {"levels": {"basic_arithmetic": 1}}
    for _ in range(10):
        scored(harder, 1.0)
    assert tasks.state()["levels"]["basic_arithmetic"] == 4  # num_terms' last level: 2..6 terms
    resumed = source(tasks="basic_arithmetic", curriculum=True)
    resumed.restore(tasks.state())
    assert resumed.rows(7, 2) == tasks.rows(7, 2)


def test_bad_options_name_the_flag() -> None:
    with pytest.raises(ConfigError, match="--reasoning_gym.tasks: reasoning-gym has no dataset 'no_such_task'"):
        source(tasks="basic_arithmetic,no_such_task")
    with pytest.raises(ValueError, match="name at least one reasoning-gym dataset"):
        ReasoningGymOptions(tasks=" , ")


def test_the_reward_is_the_tasks_own_score_of_the_answer_tag() -> None:
    rows = source(tasks="chain_sum").rows(0, 3)
    prompts = ["P0", "P1", "P2"]
    queries = [f"P0 <answer>{rows[0]['answer']}</answer>", "P1 <answer>-123456</answer>", "P2 the answer is 4"]
    result = ReasoningGymScore()(queries, prompts, [r["answer"] for r in rows], fields=rows)
    assert result["rewards"] == result["scores"] == [1.0, 0.0, 0.0]
    with pytest.raises(DataError, match="sample 0 has no 'reasoning_gym' field"):
        ReasoningGymScore()(queries[:1], prompts[:1], [None], fields=[{}])


class TestReasoningGymKit(PromptSourceKit):
    """The prompt-source kit on two tasks with their curricula (observe moves the levels that state() saves)."""

    component = ReasoningGymTasks
    plugin_module, registered_name = "rlhf_plugin_reasoning_gym", "reasoning_gym"

    def run_config(self):
        config = ppo_config()
        config.plugins["reasoning_gym"] = {"tasks": "basic_arithmetic,chain_sum", "curriculum": True, "raise_at": 0.5}
        return config
