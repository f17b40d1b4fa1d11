"""Implements a hook with an argument the spec does not have."""

import rlhf

rlhf_plugin_api = rlhf.PLUGIN_API_VERSION


@rlhf.hookimpl
def rlhf_step_end(step, metrics, trainer_state):
    pass
