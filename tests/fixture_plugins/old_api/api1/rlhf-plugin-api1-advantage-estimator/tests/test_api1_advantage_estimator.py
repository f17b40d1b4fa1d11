"""The `api1_advantage_estimator` advantage estimator against the rlhf conformance kit; add tests of your own formulas here."""

from rlhf_plugin_api1_advantage_estimator.estimator import Api1AdvantageEstimator

from rlhf.testing.conformance import AdvantageEstimatorKit


class TestApi1AdvantageEstimator(AdvantageEstimatorKit):
    component = Api1AdvantageEstimator  # built like the runtime builds it: Api1AdvantageEstimator.from_config(config)
    plugin_module = "rlhf_plugin_api1_advantage_estimator"
    registered_name = "api1_advantage_estimator"
