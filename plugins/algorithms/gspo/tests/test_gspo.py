"""GSPO against its formula."""

from __future__ import annotations

import math

import pytest
import torch
from rlhf_plugin_gspo import GSPOLoss


@pytest.mark.parametrize("seed", range(4))
def test_sequence_ratio_clip(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    logp, old = torch.randn(4, 5, generator=gen) * 0.01, torch.randn(4, 5, generator=gen) * 0.01
    adv = torch.randn(4, 5, generator=gen)
    lengths = [5, 3, 1, 0]
    mask = (torch.arange(5)[None, :] < torch.tensor(lengths)[:, None]).float()
    low, high = 3e-4, 4e-4
    loss, metrics = GSPOLoss(low, high)(logp, old, adv, mask)
    for i, n in enumerate(lengths):
        s = math.exp(sum((logp[i, t] - old[i, t]).item() for t in range(n)) / n) if n else 1.0
        for t in range(5):
            a = adv[i, t].item()
            expected = -min(s * a, min(max(s, 1 - low), 1 + high) * a) if t < n else 0.0
            assert loss[i, t].item() == pytest.approx(expected, rel=1e-5, abs=1e-6)
    assert GSPOLoss.token_level is False
    assert metrics["ppo_kl"].item() == pytest.approx((((old - logp) * mask).sum() / mask.sum()).item(), abs=1e-6)


def test_gradient_flows_through_every_token_of_the_sequence() -> None:
    logp = torch.zeros(1, 3, requires_grad=True)
    loss, _ = GSPOLoss(0.2, 0.2)(logp, torch.zeros(1, 3), torch.ones(1, 3), torch.ones(1, 3))
    loss.sum().backward()
    torch.testing.assert_close(logp.grad, torch.full((1, 3), -1.0))  # d/dℓ_t of −3·exp(mean ℓ) at 0 = −1
