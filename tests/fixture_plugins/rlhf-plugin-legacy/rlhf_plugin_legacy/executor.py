"""Built on an internal base of rlhf-core 0.1 that is gone (its replacement is rlhf_agents.executors)."""

from rlhf.runtime.agent_engine import SingleTurnExecutor


class LegacyExecutor(SingleTurnExecutor):
    pass
