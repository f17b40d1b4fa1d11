"""FlashREINFORCE against its formula."""

from __future__ import annotations

import torch
from rlhf_plugin_flash_reinforce import FlashReinforce


def test_whole_batch_baseline() -> None:
    rewards = torch.tensor([[1.0], [0.0], [0.0], [3.0]])  # n = 1
    torch.testing.assert_close(FlashReinforce().group_rewards(rewards), torch.tensor([[0.0], [-1.0], [-1.0], [2.0]]))
    assert FlashReinforce.min_samples_per_prompt == 1 and not FlashReinforce.whiten
