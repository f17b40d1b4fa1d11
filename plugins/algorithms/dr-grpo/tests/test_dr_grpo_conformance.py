"""dr_grpo through the advantage-estimator kit."""

from rlhf_plugin_dr_grpo import DrGRPO

from rlhf.testing.conformance import AdvantageEstimatorKit


class TestDrGRPO(AdvantageEstimatorKit):
    component, plugin_module, registered_name = DrGRPO, "rlhf_plugin_dr_grpo", "dr_grpo"
