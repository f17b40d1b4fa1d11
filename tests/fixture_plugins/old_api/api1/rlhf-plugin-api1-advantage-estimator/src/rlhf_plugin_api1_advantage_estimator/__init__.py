"""rlhf-plugin-api1-advantage-estimator: the `api1_advantage_estimator` advantage estimator.

This module is imported by `rlhf plugins`, the controller and every Ray worker: it imports only
`rlhf`, and registers the component as a lazy "module:attr" string, so the component module
(and torch) is imported only where a run selects `api1_advantage_estimator`.
"""

import rlhf

rlhf_plugin_api = rlhf.PLUGIN_API_VERSION


@rlhf.hookimpl
def rlhf_register_advantage_estimators(register):
    register("api1_advantage_estimator", "rlhf_plugin_api1_advantage_estimator.estimator:Api1AdvantageEstimator",
             description="TODO: what api1_advantage_estimator does, in one line")


@rlhf.hookimpl
def rlhf_register_options(register):
    # flags --api1_advantage_estimator.<field>, YAML `plugins: {api1_advantage_estimator: {...}}`; the component reads them in from_config
    register("rlhf_plugin_api1_advantage_estimator.estimator:Options", namespace="api1_advantage_estimator")
