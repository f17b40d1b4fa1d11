"""The multi-turn executor: the environment of an agent file (see the package docstring)."""

from __future__ import annotations

from typing import Any

from rlhf_agents import AgentExecutorBase, AgentInstanceBase, load_agent_class
from rlhf_agents.episodes import EnvironmentExecutor


class MultiTurnExecutor(EnvironmentExecutor):
    """:class:`rlhf_agents.episodes.EnvironmentExecutor` on the class of ``--train.agent_func_path``."""

    @classmethod
    def from_config(cls, config: Any) -> MultiTurnExecutor:
        from rlhf.errors import ConfigError

        path = config.train.agent_func_path
        if not path:
            raise ConfigError(f"--train.agent_executor {config.train.agent_executor} runs an agent file: "
                              "set --train.agent_func_path env.py (see docs/agents.md)")
        agent_class = load_agent_class(path, ("AgentInstance", "AgentExecutor"))
        if not issubclass(agent_class, (AgentInstanceBase, AgentExecutorBase)):
            raise ConfigError(f"--train.agent_func_path {path}: {agent_class.__name__} must subclass "
                              "rlhf_agents.AgentInstanceBase or AgentExecutorBase")
        return cls.for_run(agent_class, config, source=f"--train.agent_func_path {path}", namespace="multi_turn")
