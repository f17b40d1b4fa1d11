"""The post-processors as pure functions on hand-made rows (no model, no CLI)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from rlhf_plugin_best_of_n.post_processors import (
    DEFAULT_CSFT_TEMPLATE,
    POST_PROCESSORS,
    check_csft_template,
    condition_input,
    conditional_sft,
    group_samples,
    iterative_dpo,
    rejection_sampling,
    z_normalize,
)


def random_rows(seed: int) -> list[dict]:
    """Prompts with 1..5 samples each; rewards from a small set so ties are frequent."""
    rng = random.Random(seed)
    rows = []
    for prompt in rng.sample(range(100), 12):  # prompt indices not in order, as after --iter slicing
        for k in range(rng.randint(1, 5)):
            rows.append({"input": f"prompt {prompt}", "output": f"p{prompt} response {k}",
                         "reward": rng.choice([-1.0, -0.5, 0.0, 0.25, 0.5, 2.0]), "prompt_index": prompt})
    return rows


def expected_groups(rows: list[dict]) -> list[list[dict]]:
    order: list[int] = []
    for row in rows:
        if row["prompt_index"] not in order:
            order.append(row["prompt_index"])
    return [[r for r in rows if r["prompt_index"] == p] for p in order]


@pytest.mark.parametrize("seed", range(5))
def test_rs_keeps_the_first_best_response_per_prompt(seed):
    rows = random_rows(seed)
    out = rejection_sampling(rows)
    groups = expected_groups(rows)
    assert len(out) == len(groups)
    for row, samples in zip(out, groups):
        best = max(s["reward"] for s in samples)
        first_best = next(s for s in samples if s["reward"] == best)  # ties: the earliest sample
        assert row == {"input": first_best["input"], "output": first_best["output"], "reward": best}


@pytest.mark.parametrize("seed", range(5))
def test_iter_dpo_pairs_first_best_with_first_worst(seed):
    rows = random_rows(seed)
    out = iterative_dpo(rows)
    groups = expected_groups(rows)
    assert len(out) == len(groups)
    for row, samples in zip(out, groups):
        rewards = [s["reward"] for s in samples]
        chosen = samples[rewards.index(max(rewards))]
        rejected = samples[rewards.index(min(rewards))]
        assert row == {"prompt": chosen["input"], "chosen": chosen["output"], "rejected": rejected["output"],
                       "chosen_reward": max(rewards), "rejected_reward": min(rewards)}
        assert row["chosen_reward"] >= row["rejected_reward"]


def test_iter_dpo_single_response_and_all_ties():
    rows = [
        {"input": "a", "output": "only", "reward": 0.3, "prompt_index": 0},
        {"input": "b", "output": "x", "reward": 1.0, "prompt_index": 1},
        {"input": "b", "output": "y", "reward": 1.0, "prompt_index": 1},
        {"input": "c", "output": "lo", "reward": -2.0, "prompt_index": 2},
        {"input": "c", "output": "hi", "reward": 3.0, "prompt_index": 2},
    ]
    out = iterative_dpo(rows)
    assert [(r["prompt"], r["chosen"], r["rejected"]) for r in out] == [("a", "only", "only"), ("b", "x", "x"), ("c", "hi", "lo")]
    assert [r["prompt"] for r in iterative_dpo(rows, drop_ties=True)] == ["c"]


def test_same_prompt_text_in_two_rows_stays_two_prompts():
    rows = [{"input": "same", "output": "1", "reward": 1.0, "prompt_index": 0},
            {"input": "same", "output": "2", "reward": 2.0, "prompt_index": 1}]
    assert [r["output"] for r in rejection_sampling(rows)] == ["1", "2"]
    # rows without prompt_index are grouped by their input
    bare = [{k: v for k, v in r.items() if k != "prompt_index"} for r in rows]
    assert [r["output"] for r in rejection_sampling(bare)] == ["2"]
    assert len(group_samples(bare)) == 1


def test_csft_formats_rewards_with_two_decimals():
    rows = [{"input": "q1", "output": "o1", "reward": 1 / 3, "prompt_index": 0},
            {"input": "q1", "output": "o2", "reward": -1.5, "prompt_index": 0},
            {"input": "q2", "output": "o3", "reward": 2.0, "prompt_index": 1},
            {"input": "q2", "output": "o4", "reward": 0.126, "prompt_index": 1}]
    out = conditional_sft(rows)
    assert out == [{"input": "q1 <rm_score>: 0.33 ", "output": "o1"}, {"input": "q1 <rm_score>: -1.50 ", "output": "o2"},
                   {"input": "q2 <rm_score>: 2.00 ", "output": "o3"}, {"input": "q2 <rm_score>: 0.13 ", "output": "o4"}]
    custom = conditional_sft(rows[:1], template="[{reward:.1f}] {input}")
    assert custom == [{"input": "[0.3] q1", "output": "o1"}]


def test_csft_z_normalisation_over_the_whole_set():
    rng = random.Random(7)
    rewards = [rng.gauss(3.0, 2.0) for _ in range(10)]
    rows = [{"input": f"q{i // 2}", "output": f"o{i}", "reward": r, "prompt_index": i // 2} for i, r in enumerate(rewards)]
    array = np.array(rewards)
    expected = (array - array.mean()) / (array.std() + 1e-8)  # numpy std: population, as OpenRLHF
    assert z_normalize(rewards) == pytest.approx(expected.tolist(), abs=1e-12)
    out = conditional_sft(rows, normalize=True)
    assert [r["input"] for r in out] == [f"q{i // 2} <rm_score>: {z:.2f} " for i, z in enumerate(expected)]
    assert [r["output"] for r in out] == [r["output"] for r in rows]
    # equal rewards: std 0, every z is 0 (the epsilon keeps it finite)
    assert z_normalize([1.5, 1.5]) == [0.0, 0.0]


def test_condition_input_on_chat_messages_rewrites_the_last_user_turn():
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
                {"role": "assistant", "content": "hello"}, {"role": "user", "content": "2+2?"}]
    out = condition_input(messages, 0.5)
    assert out[3] == {"role": "user", "content": "2+2? <rm_score>: 0.50 "}
    assert out[:3] == messages[:3] and messages[3]["content"] == "2+2?"  # the original is not modified
    assert condition_input("q", 5.0) == "q <rm_score>: 5.00 "


def test_csft_template_checks():
    check_csft_template(DEFAULT_CSFT_TEMPLATE)
    for bad in ("{input} only", "<rm_score>: {reward:.2f}", "{input} {reward:.2f} {other}", "{input} {reward:.2q}"):
        with pytest.raises(ValueError):
            check_csft_template(bad)


def test_post_processors_refuse_unscored_rows():
    rows = [{"input": "q", "output": "o", "reward": None, "prompt_index": 0}]
    for name in ("rs", "iter_dpo", "csft"):
        function, needs_rewards, _ = POST_PROCESSORS[name]
        assert needs_rewards
        with pytest.raises(ValueError, match="no reward"):
            function(rows)
    assert POST_PROCESSORS["none"][0](rows) == rows
    assert POST_PROCESSORS["iter_dpo"][2] == 2
