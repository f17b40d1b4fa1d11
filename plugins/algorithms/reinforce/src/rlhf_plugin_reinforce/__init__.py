"""REINFORCE++ (``reinforce``) and REINFORCE++-baseline (``reinforce_baseline``).

reinforce: no group step; A_t = G_t = Σ_{k≥t} γ^{k−t} r̃_k (γ may differ from 1);
then global masked whitening.

reinforce_baseline: r_i − mean(r of its group) (n > 1), γ forced to 1, then global
masked whitening.
"""

from typing import ClassVar

import rlhf
from rlhf.estimators import GroupMeanBaselineEstimator, ReturnToGoEstimator

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


class Reinforce(ReturnToGoEstimator):
    whiten: ClassVar[bool] = True
    forces_unit_gamma: ClassVar[bool] = False


class ReinforceBaseline(GroupMeanBaselineEstimator):
    whiten: ClassVar[bool] = True


@rlhf.hookimpl
def rlhf_register_advantage_estimators(register):
    register("reinforce", Reinforce, description="REINFORCE++: discounted return, global whitening")
    register("reinforce_baseline", ReinforceBaseline, description="REINFORCE++-baseline: group-mean baseline, whitening")


@rlhf.hookimpl
def rlhf_register_presets(register):
    register("reinforce_pp", {"algo.advantage.estimator": "reinforce_baseline", "rollout.n_samples_per_prompt": 8,
                              "algo.kl.init_coef": 0.01, "algo.kl.estimator": "k2", "algo.kl.use_loss": True},
             description="REINFORCE++-baseline with a k2 KL loss")
