"""REINFORCE++ and REINFORCE++-baseline against their formulas."""

from __future__ import annotations

import pytest
import torch
from rlhf_plugin_reinforce import Reinforce, ReinforceBaseline


def test_reinforce_keeps_gamma_and_whitens() -> None:
    token_rewards = torch.tensor([[0.0, 0.0, 2.0], [1.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv, _ = Reinforce().advantages(token_rewards, mask, None, gamma=0.5, lambd=1.0)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 1.0, 2.0], [1.0, 0.0, 0.0]]))
    assert Reinforce.whiten and not Reinforce.forces_unit_gamma and Reinforce.min_samples_per_prompt == 1
    assert torch.equal(Reinforce().group_rewards(torch.ones(2, 3)), torch.ones(2, 3))


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reinforce_baseline_subtracts_the_group_mean(seed: int, dtype: torch.dtype) -> None:
    rewards = torch.randn(3, 5, generator=torch.Generator().manual_seed(seed)).to(dtype)
    out = ReinforceBaseline().group_rewards(rewards)
    r = rewards.double()
    torch.testing.assert_close(out.double(), r - r.mean(dim=1, keepdim=True), atol=1e-6, rtol=1e-6)
    assert ReinforceBaseline.whiten and ReinforceBaseline.forces_unit_gamma and ReinforceBaseline.min_samples_per_prompt == 2
