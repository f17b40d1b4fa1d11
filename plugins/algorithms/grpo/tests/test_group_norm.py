"""group_norm against its formula, on random inputs."""

from __future__ import annotations

import pytest
import torch
from rlhf_plugin_grpo.estimator import GroupNorm


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_group_rewards_are_normalised_per_prompt(seed: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(4, 8, generator=gen).to(dtype)
    out = GroupNorm().group_rewards(rewards)
    assert out.dtype == torch.float32
    r = rewards.double()
    for p in range(4):
        mean = r[p].mean()
        std = (((r[p] - mean) ** 2).sum() / 7).sqrt()
        torch.testing.assert_close(out[p].double(), (r[p] - mean) / (std + 1e-9), atol=1e-5, rtol=1e-5)


def test_all_equal_group_gives_zero_advantage() -> None:
    out = GroupNorm().group_rewards(torch.ones(2, 4))
    assert torch.equal(out, torch.zeros(2, 4))


def test_advantage_is_the_undiscounted_return_to_go() -> None:
    token_rewards = torch.tensor([[0.0, -0.1, 1.0, 0.0], [0.5, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]])
    adv, ret = GroupNorm().advantages(token_rewards, mask, None, gamma=0.5, lambd=0.3)  # gamma is forced to 1
    torch.testing.assert_close(adv, torch.tensor([[0.9, 0.9, 1.0, 0.0], [0.5, 0.0, 0.0, 0.0]]))
    assert torch.equal(adv, ret)
    assert GroupNorm.min_samples_per_prompt == 2 and GroupNorm.forces_unit_gamma and not GroupNorm.whiten
