"""The reward-model trainer and its config (see the package docstring)."""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

from pydantic import Field
from rlhf_supervised.config import PreferenceDataSection, SupervisedConfig, SupervisedModelSection
from rlhf_supervised.pairs import PairwiseTrainer
from rlhf_supervised.trainer import LossParts

from rlhf.config.base import flag


class RMModelSection(SupervisedModelSection):
    loss_type: Literal["sigmoid", "logexp"] = flag("sigmoid", "Pairwise loss: sigmoid (Bradley-Terry) or logexp")
    margin_loss_enable: bool = flag(False, "Subtract the pair's margin (--data.margin_key) inside the sigmoid loss", switch=True)
    compute_fp32_loss_enable: bool = flag(False, "Compute the loss in fp32", switch=True)


class RMConfig(SupervisedConfig):
    """``rlhf train rm``"""

    model: RMModelSection = Field(default_factory=RMModelSection)
    data: PreferenceDataSection = Field(default_factory=lambda: PreferenceDataSection(input_template=None))


class RewardModelTrainer(PairwiseTrainer):
    """Bradley-Terry reward model: one forward of chosen + rejected, reward at the last token."""

    config_class: ClassVar[type[RMConfig]] = RMConfig
    shown_metrics: ClassVar[tuple[str, ...]] = ("loss", "acc")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reward_stats: dict[str, float] | None = None

    @property
    def value_head(self) -> str:  # type: ignore[override]
        return self.config.ds.value_head_prefix

    def rewards(self, batch: Any) -> Any:
        """``(2N,)`` rewards: the head's value at each sequence's last token."""
        from rlhf_supervised.batch import at_last_token

        from rlhf.models.loading import token_values

        values = token_values(self.model.module, head=self.value_head, **batch.model_inputs())
        return at_last_token(values, batch)

    def compute(self, batch: Any, training: bool) -> LossParts:
        import torch

        from rlhf_plugin_rm.losses import pairwise_loss

        rewards = self.rewards(batch)
        if self.config.model.compute_fp32_loss_enable:
            rewards = rewards.float()
        n = batch.num_samples // 2
        chosen, rejected = rewards[:n], rewards[n:]
        margin = None
        if self.config.model.margin_loss_enable:
            margin = torch.tensor(batch.extras["margin"], dtype=rewards.dtype, device=rewards.device)
        loss = pairwise_loss(chosen, rejected, self.config.model.loss_type, margin)
        detached = rewards.detach().float()
        metrics = {
            "acc": (chosen > rejected).float().sum(),
            "chosen_reward": detached[:n].sum(),
            "rejected_reward": detached[n:].sum(),
            # per pair: the mean of the two rewards and of their squares, for the statistics
            "reward_mean": detached.view(2, n).mean(0).sum(),
            "reward_sq_mean": detached.pow(2).view(2, n).mean(0).sum(),
        }
        return LossParts(loss.sum(), metrics)

    def eval_finished(self, metrics: dict[str, float]) -> dict[str, float]:
        mean = metrics.pop("reward_mean")
        variance = max(metrics.pop("reward_sq_mean") - mean**2, 0.0)
        self.reward_stats = {"mean": mean, "std": math.sqrt(variance)}
        return {**metrics, "reward_std": self.reward_stats["std"], "reward_mean": mean}

    def final_config_updates(self) -> dict[str, Any]:
        """Reward mean/std of the last evaluation (of the training data when there is no eval set)."""
        if self.reward_stats is None:
            self.evaluate(self.train_examples)
        return {**(self.reward_stats or {}), "value_head_prefix": self.value_head}
