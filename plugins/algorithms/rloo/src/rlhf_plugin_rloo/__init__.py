"""RLOO (Ahmadian et al., 2024): the leave-one-out baseline.

Â_i = r_i − (1/(n−1))·Σ_{j≠i} r_j over the n samples of a prompt (n > 1); A_t = Σ_{k≥t} r̃_k
with γ = 1; no whitening.
"""

from typing import ClassVar

import rlhf
from rlhf.estimators import ReturnToGoEstimator
from rlhf.ops import as_float

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


class RLOO(ReturnToGoEstimator):
    min_samples_per_prompt: ClassVar[int] = 2

    def group_rewards(self, rewards):
        rewards = as_float(rewards)
        n = rewards.shape[1]
        return rewards - (rewards.sum(dim=1, keepdim=True) - rewards) / (n - 1)


@rlhf.hookimpl
def rlhf_register_advantage_estimators(register):
    register("rloo", RLOO, description="leave-one-out baseline")
