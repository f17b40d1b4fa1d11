"""Dr. GRPO against its formula."""

from __future__ import annotations

import torch
from rlhf_plugin_dr_grpo import DrGRPO


def test_group_mean_without_std() -> None:
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 3.0, 3.0, 7.0]])
    torch.testing.assert_close(DrGRPO().group_rewards(rewards), torch.tensor([[0.5, -0.5, -0.5, 0.5], [-1.0, -1.0, -1.0, 3.0]]))
    assert not DrGRPO.whiten and DrGRPO.min_samples_per_prompt == 2
