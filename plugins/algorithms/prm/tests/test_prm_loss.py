"""The PRM loss against cross-entropy written out independently per position with ``math``."""

from __future__ import annotations

import math

import pytest
import torch
from rlhf_plugin_prm.losses import SOFT, prm_loss


def log_softmax(row: list[float]) -> list[float]:
    top = max(row)
    norm = top + math.log(sum(math.exp(v - top) for v in row))
    return [v - norm for v in row]


def reference(logits, label_ids, probs, reward_ids):
    """Per position, in plain floats: (loss, correct)."""
    out = []
    for row, label, p in zip(logits, label_ids, probs):
        if reward_ids is not None:
            row = [row[t] for t in reward_ids]
        logp = log_softmax(row)
        best = max(range(len(row)), key=lambda k: (row[k], -k))  # first index on ties, like torch
        if label == SOFT:
            loss = -(p * logp[0] + (1 - p) * logp[1])
            target = 0 if p >= 1 - p else 1
        else:
            target = reward_ids.index(label) if reward_ids is not None else label
            loss = -logp[target]
        out.append((loss, float(best == target)))
    return out


def check(logits, label_ids, probs, reward_ids):
    rid = None if reward_ids is None else torch.tensor(reward_ids)
    losses, correct = prm_loss(logits, torch.tensor(label_ids), probs, rid)
    want = reference(logits.tolist(), label_ids, probs.tolist(), reward_ids)
    assert losses.shape == correct.shape == (len(label_ids),)
    assert losses.tolist() == pytest.approx([w[0] for w in want], rel=1e-5, abs=1e-6)
    assert correct.tolist() == [w[1] for w in want]
    return losses, correct


@pytest.mark.parametrize("seed", range(4))
def test_hard_labels_full_vocabulary(seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(9, 50, generator=gen) * 3
    labels = torch.randint(0, 50, (9,), generator=gen).tolist()
    labels[0] = int(logits[0].argmax())  # at least one correct
    _, correct = check(logits, labels, torch.zeros(9), None)
    assert correct[0] == 1.0


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("reward_ids", [[7, 3], [11, 2, 40]])
def test_hard_labels_restricted_to_reward_tokens(seed, reward_ids):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(12, 50, generator=gen) * 3
    labels = [reward_ids[int(i)] for i in torch.randint(0, len(reward_ids), (12,), generator=gen)]
    check(logits, labels, torch.zeros(12), reward_ids)


def test_restriction_ignores_other_tokens():
    logits = torch.zeros(1, 10)
    logits[0, 5] = 100.0  # the full-vocab argmax is not a reward token
    logits[0, 3] = 1.0
    losses, correct = prm_loss(logits, torch.tensor([3]), torch.zeros(1), torch.tensor([3, 8]))
    assert float(losses[0]) == pytest.approx(-math.log(math.e / (math.e + 1)))
    assert correct.tolist() == [1.0]


@pytest.mark.parametrize("seed", range(4))
def test_soft_and_mixed_labels(seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(10, 30, generator=gen) * 2
    probs = torch.rand(10, generator=gen)
    probs[0], probs[1], probs[2] = 0.0, 1.0, 0.5
    labels = [SOFT] * 7 + [4, 9, 4]
    check(logits, labels, probs, [4, 9])


def test_soft_label_optimum_is_the_target_distribution():
    """Minimising the soft loss over the two logits recovers p."""
    logit = torch.zeros(1, 2, requires_grad=True)
    optimizer = torch.optim.SGD([logit], lr=1.0)
    for _ in range(500):
        optimizer.zero_grad()
        prm_loss(logit, torch.tensor([SOFT]), torch.tensor([0.8]), torch.tensor([0, 1]))[0].sum().backward()
        optimizer.step()
    assert float(torch.softmax(logit.detach(), -1)[0, 0]) == pytest.approx(0.8, abs=1e-3)


@pytest.mark.parametrize("reward_ids", [None, [1, 2, 3]])
def test_soft_labels_need_two_reward_tokens(reward_ids):
    rid = None if reward_ids is None else torch.tensor(reward_ids)
    with pytest.raises(ValueError, match="two reward tokens"):
        prm_loss(torch.randn(2, 5), torch.tensor([SOFT, 1]), torch.tensor([0.3, 0.0]), rid)


def test_empty_batch_of_placeholders():
    losses, correct = prm_loss(torch.randn(0, 5), torch.zeros(0, dtype=torch.long), torch.zeros(0), torch.tensor([1, 2]))
    assert losses.shape == correct.shape == (0,) and float(losses.sum()) == 0.0
