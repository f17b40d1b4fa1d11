"""AdamW and cosine_with_min_lr follow OpenRLHF's defaults."""

from __future__ import annotations

import math

import pytest
import torch
from rlhf_plugin_adamw.optim import AdamW, CosineWithMinLR

from rlhf.testing.conformance import ppo_config


def test_deepspeed_block_uses_the_actor_flags() -> None:
    cfg = ppo_config()
    assert AdamW().deepspeed_config(cfg.actor) == {
        "type": "AdamW", "params": {"lr": 1e-6, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0}
    }
    assert AdamW().deepspeed_config(cfg.critic)["params"]["lr"] == 9e-6


def test_schedule_warms_up_then_decays_to_the_floor() -> None:
    cfg = ppo_config()
    cfg.actor.adam.lr = 1e-3
    param = torch.nn.Parameter(torch.zeros(2))
    optimizer = AdamW().build([param], cfg.actor)
    assert optimizer.defaults["betas"] == (0.9, 0.95)
    steps = 100
    scheduler = CosineWithMinLR().build(optimizer, steps, cfg.actor)
    warmup = math.ceil(0.03 * steps)
    lrs = []
    for _ in range(steps):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs[0] == 0.0 and lrs[warmup] == pytest.approx(1e-3)
    assert lrs[-1] == pytest.approx(1e-4, rel=0.05)  # min_lr_ratio 0.1
    assert all(a >= b for a, b in zip(lrs[warmup:], lrs[warmup + 1:]))
