"""The `api1_advantage_estimator` advantage estimator (contract: docs/plugins/advantage-estimator.md).

Group step: each reward minus the mean of its prompt's n rewards, times `--api1_advantage_estimator.scale`.
Advantages: the undiscounted return-to-go of the per-token rewards (γ forced to 1).
Replace the formulas with yours; `pytest` checks the contract on random inputs.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from rlhf.ops import as_float, discounted_returns


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid")

    scale: float = Field(1.0, description="multiplies the group-centred rewards")


class Api1AdvantageEstimator:
    needs_critic: ClassVar[bool] = False  # True: the runtime builds a critic and passes its values
    min_samples_per_prompt: ClassVar[int] = 2  # a group baseline needs n >= 2 samples per prompt
    whiten: ClassVar[bool] = False  # True: the core whitens the advantages over the batch afterwards
    forces_unit_gamma: ClassVar[bool] = True  # γ = 1 whatever --algo.advantage.gamma says

    def __init__(self, options: Options | None = None) -> None:
        self.options = options or Options()

    @classmethod
    def from_config(cls, config: Any) -> Api1AdvantageEstimator:
        """Built once per run, in the controller; this plugin's options are config.plugins["api1_advantage_estimator"]."""
        return cls(Options.model_validate(config.plugins.get("api1_advantage_estimator", {})))

    def group_rewards(self, rewards: Any) -> Any:
        """Scalar rewards of P prompts × n samples, (P, n) -> (P, n) in fp32."""
        rewards = as_float(rewards)
        return (rewards - rewards.mean(dim=1, keepdim=True)) * self.options.scale

    def advantages(self, token_rewards: Any, action_mask: Any, values: Any, gamma: float, lambd: float) -> tuple[Any, Any]:
        """Per-token rewards (B, T) -> (advantages, returns), both (B, T), zero on padding."""
        returns = discounted_returns(token_rewards, action_mask, 1.0)
        return returns, returns
