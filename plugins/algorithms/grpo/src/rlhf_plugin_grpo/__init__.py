"""GRPO (Shao et al., 2024) for rlhf: the ``group_norm`` advantage estimator.

For the n rewards r_1..r_n of one prompt:

    Â_i = (r_i − mean(r)) / (std_unbiased(r) + 1e-9)

and every action token of response i gets A_t = Σ_{k≥t} r̃_k with γ = 1 (the
normalised reward on the last token plus any per-token KL term). No global whitening.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_advantage_estimators(register):
    register("group_norm", "rlhf_plugin_grpo.estimator:GroupNorm", description="GRPO group-normalised rewards")
