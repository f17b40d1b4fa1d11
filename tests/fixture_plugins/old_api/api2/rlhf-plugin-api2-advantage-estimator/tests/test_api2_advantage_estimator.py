"""The `api2_advantage_estimator` advantage estimator against the rlhf conformance kit; add tests of your own formulas here."""

from rlhf_plugin_api2_advantage_estimator.estimator import Api2AdvantageEstimator

from rlhf.testing.conformance import AdvantageEstimatorKit


class TestApi2AdvantageEstimator(AdvantageEstimatorKit):
    component = Api2AdvantageEstimator  # built like the runtime builds it: Api2AdvantageEstimator.from_config(config)
    plugin_module = "rlhf_plugin_api2_advantage_estimator"
    registered_name = "api2_advantage_estimator"
