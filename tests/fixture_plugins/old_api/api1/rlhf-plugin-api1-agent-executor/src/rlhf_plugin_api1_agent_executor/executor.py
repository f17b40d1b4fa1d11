"""The `api1_agent_executor` agent executor (contract: docs/plugins/agent-executor.md).

One generation per request, with the sampling temperature scaled by `--api1_agent_executor.temperature_scale`.
Token ids and log-probs are passed on as the engine produced them: never decode and re-tokenise.
A multi-turn executor calls `engines.generate` again with the trajectory so far as the prompt.
Replace it with yours; `pytest` checks the contract against a scripted engine.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid")

    temperature_scale: float = Field(1.0, gt=0, description="multiplies --rollout.temperature")


class Api1AgentExecutor:
    def __init__(self, options: Options | None = None) -> None:
        self.options = options or Options()

    @classmethod
    def from_config(cls, config: Any) -> Api1AgentExecutor:
        """Built once per run in the controller; this plugin's options are config.plugins["api1_agent_executor"]."""
        return cls(Options.model_validate(config.plugins.get("api1_agent_executor", {})))

    def run(self, requests: list[dict[str, Any]], engines: Any, sampling: dict[str, float]) -> list[dict[str, Any]]:
        """requests: prompt_ids, label, max_tokens, seed -> one dict per request, in order:
        response_ids (list[int]), logprobs (one per token), finish_reason ('stop' | 'length')."""
        temperature = sampling["temperature"] * self.options.temperature_scale
        return engines.generate(requests, temperature, sampling["top_p"])
