"""rloo through the advantage-estimator kit."""

from rlhf_plugin_rloo import RLOO

from rlhf.testing.conformance import AdvantageEstimatorKit


class TestRLOO(AdvantageEstimatorKit):
    component, plugin_module, registered_name = RLOO, "rlhf_plugin_rloo", "rloo"
