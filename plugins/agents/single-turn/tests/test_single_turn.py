"""The single-turn executor through the agent-executor kit."""

from rlhf_plugin_single_turn import SingleTurnExecutor

from rlhf.testing.conformance import AgentExecutorKit, ScriptedEngines
from rlhf.testing.conformance.parts import agent_requests


class TestSingleTurn(AgentExecutorKit):
    component, plugin_module, registered_name = SingleTurnExecutor, "rlhf_plugin_single_turn", "single_turn"


def test_one_engine_call_per_batch_and_the_engines_tokens_unchanged() -> None:
    engines, requests = ScriptedEngines(), agent_requests(4)
    out = SingleTurnExecutor().run(requests, engines, {"temperature": 1.0, "top_p": 1.0})
    assert engines.calls == [4]
    assert out == ScriptedEngines().generate(requests, 1.0, 1.0)
