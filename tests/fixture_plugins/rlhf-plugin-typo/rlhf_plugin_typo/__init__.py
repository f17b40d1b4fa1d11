"""Implements a misspelled hook name."""

import rlhf

rlhf_plugin_api = rlhf.PLUGIN_API_VERSION


@rlhf.hookimpl
def rlhf_register_advantage_estimator(register):
    register("never", "nowhere:Nothing")
