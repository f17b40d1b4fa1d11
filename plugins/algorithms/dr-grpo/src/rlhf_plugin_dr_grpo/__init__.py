"""Dr. GRPO (Liu et al., 2025): GRPO without the std division.

Â_i = r_i − mean(r) over the n samples of a prompt (n > 1); A_t = Σ_{k≥t} r̃_k with γ = 1;
no whitening. Only the advantage changes: aggregation stays ``--actor.loss_agg_mode``.
"""

from typing import ClassVar

import rlhf
from rlhf.estimators import ReturnToGoEstimator
from rlhf.ops import as_float

rlhf_plugin_api = rlhf.PLUGIN_API_VERSION


class DrGRPO(ReturnToGoEstimator):
    min_samples_per_prompt: ClassVar[int] = 2

    def group_rewards(self, rewards):
        rewards = as_float(rewards)
        return rewards - rewards.mean(dim=1, keepdim=True)


@rlhf.hookimpl
def rlhf_register_advantage_estimators(register):
    register("dr_grpo", DrGRPO, description="group mean baseline without std normalisation")
