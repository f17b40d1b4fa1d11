"""rlhf-plugin-api2-reward-function: the `api2_reward_function` reward function.

This module is imported by `rlhf plugins`, the controller and every Ray worker: it imports only
`rlhf`, and registers the component as a lazy "module:attr" string, so the component module
(and torch) is imported only where a run selects `api2_reward_function`.
"""

import rlhf

rlhf_plugin_api = rlhf.PLUGIN_API_VERSION


@rlhf.hookimpl
def rlhf_register_reward_functions(register):
    register("api2_reward_function", "rlhf_plugin_api2_reward_function.reward:Api2RewardFunctionReward",
             description="TODO: what api2_reward_function does, in one line")


@rlhf.hookimpl
def rlhf_register_options(register):
    # flags --api2_reward_function.<field>, YAML `plugins: {api2_reward_function: {...}}`; the component reads them in from_config
    register("rlhf_plugin_api2_reward_function.reward:Options", namespace="api2_reward_function")
