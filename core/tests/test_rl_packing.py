"""--ds.packing_samples and --train.dynamic_batch_enable in RL: packed rows give the padded numbers,
token-budget micro-batches cover every sample once with the same count on every rank."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from rlhf.runtime.workers.batch import action_logprobs, pack
from rlhf.runtime.workers.micro_batches import FILLER, split_to, token_budget


def random_samples(seed: int, count: int) -> tuple[list[list[int]], list[list[int]]]:
    rng = random.Random(seed)
    prompts = [[rng.randrange(10, 300) for _ in range(rng.randrange(1, 12))] for _ in range(count)]
    responses = [[rng.randrange(10, 300) for _ in range(rng.randrange(0, 9))] for _ in range(count)]  # empty ones too
    return prompts, responses


def test_a_packed_row_restarts_position_ids_for_every_sample() -> None:
    batch = pack([[5, 6, 7], [8]], [[9, 10], [11, 12, 13]], pad_id=0, packed=True)
    assert batch.input_ids.tolist() == [[5, 6, 7, 9, 10, 8, 11, 12, 13]]
    assert batch.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 2, 3]] and batch.attention_mask is None
    assert batch.action_index.tolist() == [[2, 3, 0], [5, 6, 7]] and batch.actions.tolist() == [[9, 10, 0], [11, 12, 13]]
    assert batch.last_index.tolist() == [4, 8]


@pytest.mark.parametrize("seed", range(3))
def test_packed_and_padded_give_the_same_logprobs_values_and_rewards(seed: int, tiny_causal_lm_path: Path,
                                                                     tiny_reward_model_path: Path) -> None:
    from rlhf.models.loading import load_causal_lm, load_value_model, token_values

    prompts, responses = random_samples(seed, 6)
    padded, packed = pack(prompts, responses, 3), pack(prompts, responses, 3, packed=True)
    policy = load_causal_lm(str(tiny_causal_lm_path), torch.float32, "sdpa").eval()
    critic = load_value_model(str(tiny_reward_model_path), torch.float32, "sdpa", require_head=True).eval()
    with torch.no_grad():
        logp = [action_logprobs(policy(**b.model_inputs()).logits, b, temperature=0.7)[0] for b in (padded, packed)]
        values = [b.at_actions(token_values(critic, **b.model_inputs())) * b.action_mask for b in (padded, packed)]
        rewards = [b.at_last_token(token_values(critic, **b.model_inputs())) for b in (padded, packed)]
    for name, (a, b) in {"logprobs": logp, "values": values, "rewards": rewards}.items():
        torch.testing.assert_close(b, a, rtol=0, atol=1e-5, msg=name)
    assert logp[0].abs().sum() > 0 and values[0].abs().sum() > 0
    # the check can fail: one causal row without the per-sample restarts reads other samples' tokens
    unrestarted = {"input_ids": packed.input_ids, "use_cache": False}
    with torch.no_grad():
        leaked = action_logprobs(policy(**unrestarted).logits, packed, temperature=0.7)[0]
    assert (leaked - logp[0]).abs().max() > 1e-3


def test_token_budget_keeps_order_and_never_exceeds_the_budget_but_for_a_single_long_sample() -> None:
    lengths = [5, 3, 9, 2, 2, 14, 1]
    batches = token_budget(list(range(7)), lengths, max_tokens=10)
    assert batches == [[0, 1], [2], [3, 4], [5], [6]]
    assert all(sum(lengths[i] for i in b) <= 10 or len(b) == 1 for b in batches)


def test_split_to_reaches_the_group_count_by_splitting_the_heaviest_then_fillers() -> None:
    lengths = [4, 4, 4, 4, 1, 1]
    assert split_to([[0, 1, 2, 3], [4, 5]], lengths, 3) == [[0, 1], [2, 3], [4, 5]]
    assert split_to([[0], [1]], lengths, 4) == [[0], [1], FILLER, FILLER]
    rng = random.Random(0)
    for _ in range(50):
        n = rng.randrange(1, 12)
        lengths = [rng.randrange(1, 20) for _ in range(n)]
        batches = split_to(token_budget(list(range(n)), lengths, 25), lengths, rng.randrange(1, 15))
        assert sorted(i for b in batches for i in b) == list(range(n))  # every sample exactly once
