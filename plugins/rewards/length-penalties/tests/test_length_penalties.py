"""Length penalties against their formulas, on random inputs."""

from __future__ import annotations

import pytest
import torch
from rlhf_plugin_length_penalties import OverlongPenalty, StopProperlyPenalty

from rlhf.testing.conformance import ppo_config


@pytest.mark.parametrize("seed", range(4))
def test_overlong_penalty(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    rewards = torch.randn(16, generator=gen)
    lengths = torch.randint(0, 101, (16,), generator=gen)
    shaper = OverlongPenalty(buffer_len=20, factor=0.5, max_length=100)
    out = shaper.apply(rewards, {"response_lengths": lengths})
    for r, n, o in zip(rewards.tolist(), lengths.tolist(), out.tolist()):
        expected = r - (min(n - 80, 20) / 20 * 0.5 if n > 80 else 0.0)
        assert o == pytest.approx(expected, abs=1e-6)
    assert (out - rewards).min() >= -0.5


def test_stop_properly_penalty_scales_or_replaces_truncated_rewards() -> None:
    rewards = torch.tensor([1.0, 1.0, -2.0])
    truncated = torch.tensor([True, False, True])
    assert StopProperlyPenalty(0.5).apply(rewards, {"truncated": truncated}).tolist() == [0.5, 1.0, -1.0]
    assert StopProperlyPenalty(-0.5).apply(rewards, {"truncated": truncated}).tolist() == [-0.5, 1.0, -0.5]


def test_enabled_by_their_flags() -> None:
    cfg = ppo_config()
    assert not OverlongPenalty.from_config(cfg).active and not StopProperlyPenalty.from_config(cfg).active
    cfg.reward.overlong_buffer_len, cfg.rollout.max_new_tokens = 4, 16
    shaper = OverlongPenalty.from_config(cfg)
    assert shaper.active and shaper.max_length == 16 and shaper.factor == 1.0
