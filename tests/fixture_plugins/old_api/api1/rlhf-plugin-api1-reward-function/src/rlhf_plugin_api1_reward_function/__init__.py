"""rlhf-plugin-api1-reward-function: the `api1_reward_function` reward function.

This module is imported by `rlhf plugins`, the controller and every Ray worker: it imports only
`rlhf`, and registers the component as a lazy "module:attr" string, so the component module
(and torch) is imported only where a run selects `api1_reward_function`.
"""

import rlhf

rlhf_plugin_api = rlhf.PLUGIN_API_VERSION


@rlhf.hookimpl
def rlhf_register_reward_functions(register):
    register("api1_reward_function", "rlhf_plugin_api1_reward_function.reward:Api1RewardFunctionReward",
             description="TODO: what api1_reward_function does, in one line")


@rlhf.hookimpl
def rlhf_register_options(register):
    # flags --api1_reward_function.<field>, YAML `plugins: {api1_reward_function: {...}}`; the component reads them in from_config
    register("rlhf_plugin_api1_reward_function.reward:Options", namespace="api1_reward_function")
