"""The controller's reward stage: the reward manager it selects, the sources it hands it, and what it does
with the answer (rewards and scores on the samples, skipped groups, logs)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from rlhf.components import RewardResult, build
from rlhf.errors import ConfigError
from rlhf.host.plugin_host import PluginHost
from rlhf.host.selection import PluginSelection
from rlhf.registry import ComponentError
from rlhf.registry import ComponentKind as K
from rlhf.reward_terms import call_reward
from rlhf.runtime.control.rewarding import RewardStage
from rlhf.runtime.workers.batch import Sample
from rlhf.testing.conformance import ppo_config

#: the worked example of docs/plugins/reward-manager.md
BEST_OF = Path(__file__).parents[1] / "docs" / "plugins" / "examples" / "best_of_rewards.py"


def registry(plugins: str | None = None):
    return PluginHost.load(PluginSelection.from_cli(plugins, False)).registry


def stage(plugins: str | None = None, agent_rewards: bool = False, **reward: object) -> RewardStage:
    config = ppo_config(reward=reward, data={"label_key": "label"},
                        train={"agent_func_path": "env.py"} if agent_rewards else {})
    return RewardStage(config, registry(plugins), agent_rewards=agent_rewards)


def samples(answers: list[str], agent_rewards: list[float] | None = None) -> list[Sample]:
    return [Sample(prompt_ids=[1], response_ids=[2], rollout_logprobs=[0.0], prompt="Q: ", response=answer, label="4",
                   group=i // 2, agent=None if agent_rewards is None else
                   {"reward": agent_rewards[i], "score": 10 + agent_rewards[i], "extra_logs": {}})
            for i, answer in enumerate(answers)]


def test_the_selected_manager_gets_the_sources_and_its_answer_lands_on_the_samples() -> None:
    batch = samples(["The answer is 4", "5", "<think>x</think> <answer>4</answer>", "<think>x</think> 7"])
    logs, skipped = stage(str(BEST_OF), manager="best_of").reward(batch)
    each = [call_reward(build(registry().get(K.REWARD_FUNCTION, name), ppo_config()), [s.prompt + s.response for s in batch],
                        [s.prompt for s in batch], [s.label for s in batch], source=name).rewards
            for name in ("math_answer", "format")]
    assert each[0] != each[1]  # the functions disagree, so max and min are real choices
    assert [s.reward for s in batch] == [max(pair) for pair in zip(*each)]
    assert [s.score for s in batch] == [min(pair) for pair in zip(*each)]
    assert logs == {"reward/agreement": sum(a == b for a, b in zip(*each)) / 4} and not skipped


def test_groups_a_manager_skips_are_returned_by_group() -> None:
    class SkipsSample2:
        def __init__(self, sources):
            pass

        def __call__(self, batch):
            return RewardResult([1.0] * len(batch.queries), [0.5] * len(batch.queries), skipped={2})

    reward_stage = stage(functions="format")
    reward_stage.manager = SkipsSample2(None)
    assert reward_stage.reward(samples(["a", "b", "c", "d"]))[1] == {1}  # samples 2 and 3 are prompt group 1


def test_an_unknown_manager_is_one_error_naming_the_flag_and_the_installed_ones() -> None:
    with pytest.raises(ComponentError, match=r"--reward.manager 'nope': no reward manager of that name is installed.*weighted"):
        stage(manager="nope", functions="math_answer")


def test_a_reward_function_that_needs_labels_is_refused_without_a_label_key() -> None:
    config = ppo_config(reward={"functions": "math_answer"})
    with pytest.raises(ConfigError, match="--reward.functions math_answer: .*--data.label_key is not set"):
        RewardStage(config, PluginHost.load(PluginSelection.from_cli(None, False)).registry)


@pytest.mark.parametrize(("functions", "agent_weight"), [(None, 1.0), ("math_answer:0.5", 1.0),
                                                         ("agent:0.25,math_answer:0.5", 0.25)])
def test_an_environments_reward_is_one_weighted_term_beside_the_reward_functions(functions, agent_weight) -> None:
    rewards = [random.uniform(-1, 1) for _ in range(4)]
    batch = samples(["4", "5", "The answer is 4", "x"], rewards)
    logs, skipped = stage(agent_rewards=True, functions=functions).reward(batch)
    correct = [1.0, 0.0, 1.0, 0.0]
    math_weight = 0.5 if functions else 0.0
    for sample, env, right in zip(batch, rewards, correct):
        assert sample.reward == pytest.approx(agent_weight * env + math_weight * right)
        assert sample.score == pytest.approx(10 + env)  # the environment's scores, unless --reward.score_term says
    assert logs["reward/agent"] == pytest.approx(sum(rewards) / 4) and not skipped
    assert ("reward/math_answer" in logs) == bool(functions)


def test_reward_score_term_can_name_a_function_beside_an_environment() -> None:
    batch = samples(["4", "5"], [0.3, 0.7])
    stage(agent_rewards=True, functions="math_answer:1.0", score_term="math_answer").reward(batch)
    assert [s.score for s in batch] == [1.0, 0.0]


def test_each_terms_value_and_the_columns_sources_add_land_on_the_samples() -> None:
    """The weighted manager keeps each term's per-sample value and the columns an environment (or a reward function)
    adds, under ``<term>/<name>``, for the sample table and the rollout dump; a column that is not text or a number
    is the source's error."""
    from rlhf.errors import RewardSourceError

    rng = random.Random(0)
    agent_rewards = [rng.random() for _ in range(4)]
    batch = samples(["4", "5", "4", "x"], agent_rewards)
    for i, sample in enumerate(batch):
        sample.agent["columns"] = {"tool_output": f"ran {i}"}
    reward_stage = stage(agent_rewards=True, functions="agent:0.5,math_answer:2")
    reward_stage.reward(batch)
    math = [s.terms["math_answer"] for s in batch]
    assert [s.terms["agent"] for s in batch] == agent_rewards and math == [1.0, 0.0, 1.0, 0.0]
    assert [s.reward for s in batch] == pytest.approx([0.5 * a + 2 * m for a, m in zip(agent_rewards, math)])
    assert [s.columns for s in batch] == [{"agent/tool_output": f"ran {i}"} for i in range(4)]
    batch[1].agent["columns"] = {"tool_output": ["not", "one value"]}
    with pytest.raises(RewardSourceError, match="column 'tool_output' must hold text or numbers"):
        reward_stage.reward(batch)


def test_every_field_of_a_prompt_row_reaches_the_reward_functions(tmp_path: Path, tiny_tokenizer_path) -> None:
    """A task row's fields beside its input and label (a difficulty, its tests) travel with its prompt to the samples
    and arrive in a reward file's ``fields`` keyword, one dict per sample, as the dataset held them."""
    from transformers import AutoTokenizer

    from rlhf.config.ppo import DataSection
    from rlhf.data.prompts import build_prompts, load_prompt_rows
    from rlhf.runtime.rollout.agents import generate_samples

    rng = random.Random(0)
    rows = [{"question": f"{a}+{a}=", "answer": 2 * a, "difficulty": rng.randint(1, 9), "meta": {"tests": [a]}}
            for a in range(4)]
    dataset = tmp_path / "tasks.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in rows))
    data = DataSection(prompt_dataset=str(dataset), input_key="question", label_key="answer")
    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_path)
    prompts = build_prompts(load_prompt_rows(data, seed=0), data, tokenizer, str(dataset))

    class OneTokenEach:  # the executor's side is not under test here: every request answered with one token
        def run(self, requests, engines, sampling):
            assert all(r["fields"] == {"difficulty": row["difficulty"], "meta": row["meta"]} for r, row in
                       zip(requests[::2], rows))
            return [{"response_ids": [7], "logprobs": [-1.0], "finish_reason": "stop"} for _ in requests]

    config = ppo_config(data={"label_key": "answer", "max_len": 64})
    batch = generate_samples(config, OneTokenEach(), None, tokenizer, prompts, 2, 1.0, 0)
    reward_file = tmp_path / "reward.py"
    reward_file.write_text("def reward_func(queries, prompts, labels, fields, **kwargs):\n"
                           "    return [float(f['difficulty']) + 10 * f['meta']['tests'][0] for f in fields]\n")
    RewardStage(ppo_config(reward={"remote_url": str(reward_file)}, data={"label_key": "answer"}), registry()).reward(batch)
    assert [s.reward for s in batch] == [float(row["difficulty"] + 10 * row["meta"]["tests"][0]) for row in rows
                                         for _ in range(2)]
