"""The `api2_reward_function` reward function (contract: docs/plugins/reward-function.md).

OpenRLHF's batched `reward_func(queries, prompts, labels, **kwargs)`: `--api2_reward_function.scale` when the
response (the query after its prompt) contains the label, else 0. Replace it with yours;
`pytest` checks the contract on sample texts.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid")

    scale: float = Field(1.0, description="reward of a response that contains the label")


class Api2RewardFunctionReward:
    needs_labels = True  # a run without --data.label_key is refused at start instead of scoring empty labels

    def __init__(self, options: Options | None = None) -> None:
        self.options = options or Options()

    @classmethod
    def from_config(cls, config: Any) -> Api2RewardFunctionReward:
        """Built once per run in the reward process; this plugin's options are config.plugins["api2_reward_function"]."""
        return cls(Options.model_validate(config.plugins.get("api2_reward_function", {})))

    def __call__(self, queries: list[str], prompts: list[str], labels: list[Any], **columns: Any) -> list[float]:
        """One float per sample; `columns` also holds prompt_ids, response_ids and finish_reasons."""
        return [self.options.scale * float(str(label) in query[len(prompt):])
                for query, prompt, label in zip(queries, prompts, labels)]
