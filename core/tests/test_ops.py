"""Shared masked math against its formulas."""

from __future__ import annotations

import pytest
import torch

from rlhf.ops import discounted_returns, masked_mean, masked_whiten


@pytest.mark.parametrize("seed", range(4))
def test_masked_whiten_matches_the_formula(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    values = torch.randn(4, 6, generator=gen).to(torch.bfloat16)
    mask = (torch.rand(4, 6, generator=gen) > 0.3).float()
    v, m = values.double(), mask.double()
    mean = (v * m).sum() / m.sum()
    var = (((v - mean) ** 2) * m).sum() / m.sum()
    torch.testing.assert_close(masked_whiten(values, mask).double(), (v - mean) / var.clamp(min=1e-8).sqrt(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(masked_whiten(values, mask, std_norm=False).double(), v - mean, atol=1e-6, rtol=1e-6)


def test_masked_mean_of_an_empty_mask_is_zero() -> None:
    assert masked_mean(torch.ones(2, 3), torch.zeros(2, 3)).item() == 0.0
    torch.testing.assert_close(masked_mean(torch.arange(6.0).view(2, 3), torch.tensor([[1.0, 1, 0], [0, 0, 0]]), dim=1),
                               torch.tensor([0.5, 0.0]))


def test_discounted_returns() -> None:
    out = discounted_returns(torch.tensor([[1.0, 2.0, 4.0]]), torch.tensor([[1.0, 1.0, 0.0]]), 0.5)
    torch.testing.assert_close(out, torch.tensor([[2.0, 2.0, 0.0]]))
