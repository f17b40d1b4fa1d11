"""reinforce and reinforce_baseline through the advantage-estimator kit."""

from rlhf_plugin_reinforce import Reinforce, ReinforceBaseline

from rlhf.testing.conformance import AdvantageEstimatorKit


class TestReinforce(AdvantageEstimatorKit):
    component, plugin_module, registered_name = Reinforce, "rlhf_plugin_reinforce", "reinforce"


class TestReinforceBaseline(AdvantageEstimatorKit):
    component, plugin_module, registered_name = ReinforceBaseline, "rlhf_plugin_reinforce", "reinforce_baseline"
