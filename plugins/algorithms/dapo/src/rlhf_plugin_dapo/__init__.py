"""DAPO (Yu et al., 2025): dynamic filtering of prompt groups, and the ``dapo`` preset.

``--algo.dynamic_filtering_enable`` keeps a prompt group iff the mean of its scores lies
strictly inside ``--algo.dynamic_filtering_range`` (default (0, 1): for 0/1 scores, drop
all-wrong and all-right groups). Each rejected group pulls one replacement prompt; the
metric ``dynamic_filtering_pass_rate`` is accepted / consumed × 100.

Beyond OpenRLHF: ``--dapo.drop_zero_variance`` also drops groups whose scores are all equal
(zero variance, so zero advantage), which matters for non-binary rewards.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)

DAPO_PRESET = {
    "algo.advantage.estimator": "group_norm",
    "algo.kl.use_loss": True,
    "algo.kl.estimator": "k3",
    "algo.kl.init_coef": 1e-3,
    "actor.eps_clip_low_high": [0.2, 0.27],
    "algo.dynamic_filtering_enable": True,
    "algo.dynamic_filtering_range": [0.0, 1.0],
    "rollout.n_samples_per_prompt": 8,
}


@rlhf.hookimpl
def rlhf_register_sample_filters(register):
    register("dynamic_filtering", "rlhf_plugin_dapo.filtering:DynamicFilter",
             description="keep groups whose mean score is strictly inside the range")


@rlhf.hookimpl
def rlhf_register_presets(register):
    register("dapo", DAPO_PRESET, description="group_norm, k3 KL loss 1e-3, clip-higher 0.2/0.27, dynamic filtering, n=8")


@rlhf.hookimpl
def rlhf_register_options(register):
    register("rlhf_plugin_dapo.filtering:DapoOptions", namespace="dapo")
