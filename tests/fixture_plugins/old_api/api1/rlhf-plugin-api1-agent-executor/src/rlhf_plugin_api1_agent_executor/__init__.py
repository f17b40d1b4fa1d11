"""rlhf-plugin-api1-agent-executor: the `api1_agent_executor` agent executor.

This module is imported by `rlhf plugins`, the controller and every Ray worker: it imports only
`rlhf`, and registers the component as a lazy "module:attr" string, so the component module
(and torch) is imported only where a run selects `api1_agent_executor`.
"""

import rlhf

rlhf_plugin_api = rlhf.PLUGIN_API_VERSION


@rlhf.hookimpl
def rlhf_register_agent_executors(register):
    register("api1_agent_executor", "rlhf_plugin_api1_agent_executor.executor:Api1AgentExecutor",
             description="TODO: what api1_agent_executor does, in one line")


@rlhf.hookimpl
def rlhf_register_options(register):
    # flags --api1_agent_executor.<field>, YAML `plugins: {api1_agent_executor: {...}}`; the component reads them in from_config
    register("rlhf_plugin_api1_agent_executor.executor:Options", namespace="api1_agent_executor")
