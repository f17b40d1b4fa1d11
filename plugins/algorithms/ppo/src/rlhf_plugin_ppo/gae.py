"""Generalised advantage estimation.

With rewards r_t and critic values V_t masked by m_t, and V_{T+1} = 0:

    δ_t = r_t + γ·V_{t+1} − V_t
    A_t = δ_t + γ·λ·A_{t+1}
    R_t = A_t + V_t

The advantages are then whitened globally by the core (``whiten = True``).
"""

from __future__ import annotations

from typing import ClassVar

from rlhf.ops import as_float


class GAE:
    needs_critic: ClassVar[bool] = True
    min_samples_per_prompt: ClassVar[int] = 1
    whiten: ClassVar[bool] = True
    forces_unit_gamma: ClassVar[bool] = False

    def group_rewards(self, rewards):
        """No group step: ``(P, n)`` rewards are returned as fp32."""
        return as_float(rewards)

    def advantages(self, token_rewards, action_mask, values, gamma, lambd):
        import torch

        if values is None:
            raise ValueError("gae needs critic values; the runtime must build a critic for this estimator")
        mask = as_float(action_mask)
        rewards = as_float(token_rewards) * mask
        values = as_float(values) * mask
        advantages = torch.zeros_like(rewards)
        last = torch.zeros_like(rewards[:, 0])
        length = rewards.shape[1]
        for t in reversed(range(length)):
            next_value = values[:, t + 1] if t + 1 < length else torch.zeros_like(last)
            delta = rewards[:, t] + gamma * next_value - values[:, t]
            last = delta + gamma * lambd * last
            advantages[:, t] = last
        return advantages, advantages + values
