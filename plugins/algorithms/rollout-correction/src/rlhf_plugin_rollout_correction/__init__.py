"""Importance-sampling correction of the train/rollout mismatch: TIS, ICEPOP, seq-mask-tis and the
FlashREINFORCE trust region, switched on by ``--algo.advantage.is_correction_level token|seq``.

This module runs at plugin load and imports nothing heavy.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_rollout_corrections(register):
    register("importance_sampling", "rlhf_plugin_rollout_correction.importance:ImportanceSampling",
             description="per-token or per-sequence IS weights, clipped or masked outside their bounds (TIS, ICEPOP…)")
