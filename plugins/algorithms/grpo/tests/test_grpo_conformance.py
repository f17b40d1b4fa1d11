"""group_norm through the advantage-estimator kit."""

from rlhf_plugin_grpo.estimator import GroupNorm

from rlhf.testing.conformance import AdvantageEstimatorKit


class TestGroupNorm(AdvantageEstimatorKit):
    component, plugin_module, registered_name = GroupNorm, "rlhf_plugin_grpo", "group_norm"
