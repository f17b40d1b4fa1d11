"""The padded tensors workers train on, against a row-by-row construction on random batches."""

import random

import pytest
import torch

from rlhf.runtime.workers.batch import action_logprobs, pack, pad_list
from rlhf.runtime.workers.group import split_bounds


def reference_pack(prompts, responses, pad_id):
    length = max(len(p) + len(r) for p, r in zip(prompts, responses))
    width = max(1, max(len(r) for r in responses))
    rows = len(prompts)
    input_ids, attention = torch.full((rows, length), pad_id), torch.zeros((rows, length), dtype=torch.long)
    index, mask, actions = (torch.zeros((rows, width), dtype=torch.long), torch.zeros((rows, width)),
                            torch.zeros((rows, width), dtype=torch.long))
    for i, (p, r) in enumerate(zip(prompts, responses)):
        for j, token in enumerate(p + r):
            input_ids[i, j], attention[i, j] = token, 1
        for j, token in enumerate(r):
            index[i, j], mask[i, j], actions[i, j] = len(p) - 1 + j, 1.0, token
    return input_ids, attention, index, mask, actions


@pytest.mark.parametrize("seed", range(5))
def test_pack_matches_a_row_by_row_build(seed):
    rng = random.Random(seed)
    for _ in range(40):
        rows = rng.randrange(1, 9)
        prompts = [[rng.randrange(1, 99) for _ in range(rng.randrange(1, 8))] for _ in range(rows)]
        responses = [[rng.randrange(1, 99) for _ in range(rng.randrange(0, 7))] for _ in range(rows)]  # empty ones too
        pad_id = rng.choice([0, 3])
        batch = pack(prompts, responses, pad_id)
        got = (batch.input_ids, batch.attention_mask, batch.action_index, batch.action_mask, batch.actions)
        for name, tensor, expected in zip(("input_ids", "attention", "index", "mask", "actions"), got,
                                          reference_pack(prompts, responses, pad_id)):
            assert tensor.dtype == expected.dtype, name
            assert torch.equal(tensor, expected), (name, prompts, responses)


def test_action_logprobs_read_the_token_after_each_position():
    prompts, responses = [[5, 6, 7], [5]], [[8, 9], []]
    batch = pack(prompts, responses, 0)
    logits = torch.randn(2, batch.input_ids.shape[1], 12)
    logp, entropy = action_logprobs(logits, batch)
    expected = torch.log_softmax(logits[0], -1)
    assert torch.allclose(logp[0], torch.stack([expected[2, 8], expected[3, 9]]))
    assert torch.equal(logp[1], torch.zeros(2)) and entropy is None  # an empty response has no action


def test_pad_list_left_aligns_rows_and_pads_with_zero():
    rng = random.Random(0)
    rows = [[rng.random() for _ in range(rng.randrange(0, 6))] for _ in range(30)]
    out = pad_list(rows, 7)
    assert out.shape == (30, 7) and out.dtype == torch.float32
    for i, row in enumerate(rows):
        assert torch.equal(out[i, : len(row)], torch.tensor(row, dtype=torch.float32))
        assert not out[i, len(row):].any()


@pytest.mark.parametrize("count,parts", [(0, 2), (1, 3), (7, 2), (256, 4), (5, 5)])
def test_split_bounds_cover_every_item_once_in_order(count, parts):
    bounds = split_bounds(count, parts)
    assert len(bounds) == parts and bounds[0][0] == 0 and bounds[-1][1] == count
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    sizes = [b - a for a, b in bounds]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("seed", range(3))
def test_pack_zeroes_environment_tokens_of_multi_turn_responses(seed):
    rng = random.Random(seed)
    prompts = [[rng.randrange(1, 99) for _ in range(rng.randrange(1, 6))] for _ in range(6)]
    responses = [[rng.randrange(1, 99) for _ in range(rng.randrange(1, 9))] for _ in range(6)]
    masks = [[rng.randrange(2) for _ in r] if i % 3 else None for i, r in enumerate(responses)]
    batch = pack(prompts, responses, 0, action_masks=masks)
    plain = pack(prompts, responses, 0)
    expected = plain.action_mask.clone()
    for i, mask in enumerate(masks):
        if mask is not None:
            expected[i, : len(mask)] = torch.tensor(mask, dtype=torch.float32)
    assert torch.equal(batch.action_mask, expected)
    assert torch.equal(batch.actions, plain.actions) and torch.equal(batch.input_ids, plain.input_ids)
    assert torch.equal(pack(prompts, responses, 0, packed=True, action_masks=masks).action_mask, expected)


def test_the_reward_sits_on_the_last_model_token_when_a_trajectory_ends_with_feedback():
    from types import SimpleNamespace

    from rlhf.estimators import ReturnToGoEstimator
    from rlhf.runtime.control.experience import compute_advantages
    from rlhf.runtime.workers.batch import Sample

    config = SimpleNamespace(reward=SimpleNamespace(clip_range=(-10.0, 10.0)),
                             algo=SimpleNamespace(kl=SimpleNamespace(use_loss=False),
                                                  advantage=SimpleNamespace(gamma=1.0, lambd=1.0, no_std_norm=False)))
    rng = random.Random(0)
    masks = [[1, 1, 0, 0, 1, 0, 0], [1, 1, 1], [1, 0, 1, 1, 0]]
    rewards = [rng.uniform(-2, 2) for _ in masks]
    samples = [Sample(prompt_ids=[1, 2], response_ids=[5] * len(m), rollout_logprobs=[0.0] * len(m), action_mask=m,
                      reward=r) for m, r in zip(masks, rewards)]
    advantages, _, _ = compute_advantages(samples, 1, config, ReturnToGoEstimator(), 0.0, None, None, None)
    for mask, reward, row in zip(masks, rewards, advantages):
        last = max(i for i, m in enumerate(mask) if m)
        # γ = 1 returns-to-go of one reward on the last model token: r on every model token up to it, 0 elsewhere
        assert row == pytest.approx([reward * m if i <= last else 0.0 for i, m in enumerate(mask)], abs=1e-6)

def test_collate_media_concatenates_samples_and_zero_pads_the_other_axes():
    import numpy as np

    from rlhf.media import collate_media

    qwen = [{"pixel_values": np.ones((16, 6)), "image_grid_thw": np.array([[1, 4, 4]]), "images": [b"png"]},
            None, {"pixel_values": np.full((32, 6), 2.0), "image_grid_thw": np.array([[1, 4, 4], [1, 4, 4]])}]
    out = collate_media(qwen)
    assert set(out) == {"pixel_values", "image_grid_thw"}  # encoded images are not a model input
    assert out["pixel_values"].shape == (48, 6) and out["image_grid_thw"].tolist() == [[1, 4, 4]] * 3
    idefics = [{"pixel_values": np.ones((1, 1, 3, 4, 4))}, {"pixel_values": np.ones((1, 2, 3, 4, 4))}]
    padded = collate_media(idefics)["pixel_values"]
    assert padded.shape == (2, 2, 3, 4, 4) and not padded[0, 1].any() and padded[1].all()
    assert collate_media([None, None]) == {}
