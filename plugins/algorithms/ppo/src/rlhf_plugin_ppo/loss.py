"""PPO-clip policy loss, per token.

    ρ_t = exp(clamp(log π_θ − log π_old, −20, 20))
    ℓ_t = −min(ρ_t·A_t, clip(ρ_t, 1 − ε_lo, 1 + ε_hi)·A_t)

Dual-clip (c > 1): for A_t < 0, ℓ_t = −max(min(ρA, clip(ρ)A), c·A).
Metrics: ``ppo_clip_ratio`` (share of tokens where the clipped term is smaller)
and ``ppo_kl`` (masked mean of log π_old − log π_θ).
"""

from __future__ import annotations

from typing import ClassVar

from rlhf.ops import as_float, masked_mean


class PPOClipLoss:
    token_level: ClassVar[bool] = True

    def __init__(self, eps_low: float = 0.2, eps_high: float = 0.2, dual_clip: float | None = None) -> None:
        if dual_clip is not None and dual_clip <= 1.0:
            raise ValueError(f"--actor.dual_clip must be > 1 (got {dual_clip})")
        self.eps_low, self.eps_high, self.dual_clip = eps_low, eps_high, dual_clip

    @classmethod
    def from_config(cls, config) -> PPOClipLoss:
        low, high = config.actor.eps_clip_low_high or (config.actor.eps_clip, config.actor.eps_clip)
        return cls(low, high, config.actor.dual_clip)

    def __call__(self, log_probs, old_log_probs, advantages, action_mask):
        import torch

        log_ratio = as_float(log_probs) - as_float(old_log_probs)
        ratio = torch.exp(log_ratio.clamp(-20.0, 20.0))
        advantages = as_float(advantages)
        unclipped = ratio * advantages
        clipped = ratio.clamp(1 - self.eps_low, 1 + self.eps_high) * advantages
        surrogate = torch.min(unclipped, clipped)
        if self.dual_clip is not None:
            dual = torch.max(surrogate, self.dual_clip * advantages)
            surrogate = torch.where(advantages < 0, dual, surrogate)
        loss = -surrogate * action_mask
        metrics = {
            "ppo_clip_ratio": masked_mean((clipped < unclipped).float(), action_mask).detach(),
            "ppo_kl": masked_mean(-log_ratio, action_mask).detach(),
        }
        return loss, metrics
