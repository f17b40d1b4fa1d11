"""Targets a plugin API this core does not implement."""

import rlhf

rlhf_plugin_api = 99


@rlhf.hookimpl
def rlhf_register_advantage_estimators(register):
    register("from_the_future", "rlhf_plugin_future:Estimator")
