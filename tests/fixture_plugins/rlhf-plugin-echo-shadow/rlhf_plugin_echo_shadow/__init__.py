"""Registers a reward name that the echo plugin already registered."""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs


@rlhf.hookimpl
def rlhf_register_reward_functions(register):
    register("echo_length", "rlhf_plugin_echo_shadow:shadow")


def shadow(queries, prompts, labels, **kwargs):
    return [0.0] * len(queries)
