"""The DPO trainer and its config (see the package docstring)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field
from rlhf_supervised.config import (
    FrozenModelSection,
    PreferenceDataSection,
    SupervisedConfig,
    SupervisedModelSection,
)
from rlhf_supervised.pairs import PairwiseTrainer
from rlhf_supervised.trainer import LossParts

from rlhf.config.base import flag


class DPOModelSection(SupervisedModelSection):
    beta: float = flag(0.1, "β: strength of the implicit KL to the reference")
    ipo_enable: bool = flag(False, "IPO loss instead of DPO", switch=True)
    label_smoothing: float = flag(0.0, "cDPO label smoothing ε (share of pairs assumed flipped)")
    nll_loss_coef: float = flag(0.0, "Weight of the chosen responses' per-token NLL (Llama-3.1 style regulariser)")


class DPOConfig(SupervisedConfig):
    """``rlhf train dpo``"""

    model: DPOModelSection = Field(default_factory=DPOModelSection)
    ref: FrozenModelSection = Field(default_factory=FrozenModelSection)
    data: PreferenceDataSection = Field(default_factory=lambda: PreferenceDataSection(input_template=None, prompt_key="prompt"))


class DPOTrainer(PairwiseTrainer):
    """Pairs forward once through the policy and once through the frozen reference."""

    config_class: ClassVar[type[DPOConfig]] = DPOConfig
    frozen_sections: ClassVar[tuple[str, ...]] = ("ref",)
    shown_metrics: ClassVar[tuple[str, ...]] = ("loss", "acc", "margin")

    def compute(self, batch: Any, training: bool) -> LossParts:
        import torch

        from rlhf_plugin_dpo.losses import dpo_loss, preference_margin

        cfg = self.config.model
        n = batch.num_samples // 2
        policy, out = self.sequence_logprobs(self.model, batch)
        reference, _ = self.sequence_logprobs(self.frozen["ref"], batch)
        z = preference_margin(policy[:n], policy[n:], reference[:n], reference[n:])
        loss = dpo_loss(z, cfg.beta, cfg.label_smoothing, cfg.ipo_enable)
        metrics: dict[str, Any] = {}
        if cfg.nll_loss_coef > 0:
            tokens = torch.zeros(batch.num_samples, device=policy.device).index_add(
                0, batch.sample_ids.clamp(min=0).flatten(), (batch.loss_mask * (batch.sample_ids >= 0)).flatten())
            nll = -policy[:n] / tokens[:n].clamp(min=1.0)  # per-token NLL of each chosen response
            loss = loss + cfg.nll_loss_coef * nll
            metrics["nll_loss"] = nll.detach().sum()
        chosen_reward = cfg.beta * (policy[:n] - reference[:n]).detach()
        rejected_reward = cfg.beta * (policy[n:] - reference[n:]).detach()
        metrics.update(acc=(chosen_reward > rejected_reward).float().sum(), chosen_reward=chosen_reward.sum(),
                       rejected_reward=rejected_reward.sum(), margin=(chosen_reward - rejected_reward).sum())
        return LossParts(loss.sum(), metrics, getattr(out, "aux_loss", None))
