"""A well-behaved third-party plugin: a reward function, options, and a step observer."""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs


@rlhf.hookimpl
def rlhf_register_reward_functions(register):
    register("echo_length", "rlhf_plugin_echo.rewards:EchoLength", description="reward = scale x response length")


@rlhf.hookimpl
def rlhf_register_options(register):
    register("rlhf_plugin_echo.rewards:EchoOptions")
