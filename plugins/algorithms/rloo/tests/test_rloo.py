"""RLOO against its formula."""

from __future__ import annotations

import pytest
import torch
from rlhf_plugin_rloo import RLOO


@pytest.mark.parametrize("seed", range(4))
def test_leave_one_out_baseline(seed: int) -> None:
    rewards = torch.randn(3, 4, generator=torch.Generator().manual_seed(seed))
    out = RLOO().group_rewards(rewards)
    for p in range(3):
        for i in range(4):
            others = [rewards[p, j].item() for j in range(4) if j != i]
            assert out[p, i].item() == pytest.approx(rewards[p, i].item() - sum(others) / 3, abs=1e-6)
    assert not RLOO.whiten and RLOO.min_samples_per_prompt == 2 and RLOO.forces_unit_gamma
