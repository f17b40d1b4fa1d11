"""Dr. GRPO (Liu et al., 2025): GRPO without the std division.

Â_i = r_i − mean(r) over the n samples of a prompt (n > 1); A_t = Σ_{k≥t} r̃_k with γ = 1;
no whitening. Only the advantage changes: aggregation stays ``--actor.loss_agg_mode``.
"""

import rlhf
from rlhf.estimators import GroupMeanBaselineEstimator

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


class DrGRPO(GroupMeanBaselineEstimator):
    """Only the advantage differs from GRPO; the group step is the shared group-mean baseline."""


@rlhf.hookimpl
def rlhf_register_advantage_estimators(register):
    register("dr_grpo", DrGRPO, description="group mean baseline without std normalisation")
