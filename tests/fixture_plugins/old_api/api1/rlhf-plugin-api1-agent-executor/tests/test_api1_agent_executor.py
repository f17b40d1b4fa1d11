"""The `api1_agent_executor` agent executor against the rlhf conformance kit; add tests of your own formulas here."""

from rlhf_plugin_api1_agent_executor.executor import Api1AgentExecutor

from rlhf.testing.conformance import AgentExecutorKit


class TestApi1AgentExecutor(AgentExecutorKit):
    component = Api1AgentExecutor  # built like the runtime builds it: Api1AgentExecutor.from_config(config)
    plugin_module = "rlhf_plugin_api1_agent_executor"
    registered_name = "api1_agent_executor"
