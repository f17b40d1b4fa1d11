"""FlashREINFORCE: a whole-batch baseline, meant for one sample per prompt.

Â_i = r_i − mean(r over the entire rollout batch); A_t = Σ_{k≥t} r̃_k with γ = 1; no whitening.
"""

import rlhf
from rlhf.estimators import ReturnToGoEstimator
from rlhf.ops import as_float

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


class FlashReinforce(ReturnToGoEstimator):
    def group_rewards(self, rewards):
        rewards = as_float(rewards)
        return rewards - rewards.mean()


@rlhf.hookimpl
def rlhf_register_advantage_estimators(register):
    register("flash_reinforce", FlashReinforce, description="rollout-batch mean baseline")
