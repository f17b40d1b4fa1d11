"""Base classes shared by advantage-estimator plugins (formulas in each plugin's docstring)."""

from __future__ import annotations

from typing import Any, ClassVar

from rlhf.ops import as_float, discounted_returns


class ReturnToGoEstimator:
    """An estimator without a critic: advantages = returns = Σ_{k≥t} γ^{k−t} r̃_k over the shaped
    per-token rewards (the scalar reward on the last token plus any KL term), with γ forced to 1
    unless ``forces_unit_gamma`` is False. Subclasses override :meth:`group_rewards`."""

    needs_critic: ClassVar[bool] = False
    min_samples_per_prompt: ClassVar[int] = 1
    whiten: ClassVar[bool] = False
    forces_unit_gamma: ClassVar[bool] = True

    def group_rewards(self, rewards: Any) -> Any:
        return as_float(rewards)

    def advantages(self, token_rewards: Any, action_mask: Any, values: Any, gamma: float, lambd: float) -> tuple[Any, Any]:
        returns = discounted_returns(token_rewards, action_mask, 1.0 if self.forces_unit_gamma else gamma)
        return returns, returns


class GroupMeanBaselineEstimator(ReturnToGoEstimator):
    """Group step r_i − mean(r of its prompt's n samples); needs n > 1."""

    min_samples_per_prompt: ClassVar[int] = 2

    def group_rewards(self, rewards: Any) -> Any:
        rewards = as_float(rewards)
        return rewards - rewards.mean(dim=1, keepdim=True)
