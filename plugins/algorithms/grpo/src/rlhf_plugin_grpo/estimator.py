"""The ``group_norm`` estimator; formula in the package docstring."""

from __future__ import annotations

from typing import ClassVar

from rlhf.estimators import ReturnToGoEstimator
from rlhf.ops import as_float


class GroupNorm(ReturnToGoEstimator):
    min_samples_per_prompt: ClassVar[int] = 2

    def group_rewards(self, rewards):
        rewards = as_float(rewards)
        mean = rewards.mean(dim=1, keepdim=True)
        std = rewards.std(dim=1, keepdim=True, unbiased=True)
        return (rewards - mean) / (std + 1e-9)
