"""The KTO trainer: its config, how rows become examples and batches, and the loss of a batch.

Runs in the trainer's process(es), one per device (see :mod:`rlhf_supervised.trainer`).
A micro-batch of N examples is one forward of 2N sequences through the policy and
through the frozen reference: the N matched (prompt i, completion i) sequences, then N
mismatched (prompt i, completion (i+1) mod N) sequences that estimate the KL reference
point. The loss is a mean over matched samples per optimizer step (units = samples).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field
from rlhf_supervised.config import (
    FrozenModelSection,
    PromptResponseDataSection,
    SupervisedConfig,
    SupervisedModelSection,
)
from rlhf_supervised.trainer import LossParts, SupervisedTrainer

from rlhf.config.base import ConfigError, flag


class KTOModelSection(SupervisedModelSection):
    beta: float = flag(0.01, "KTO β: scale of the implicit reward log π/π_ref")
    desirable_loss_weight: float = flag(1.0, "Weight of the loss of desirable samples")
    undesirable_loss_weight: float = flag(1.0, "Weight of the loss of undesirable samples")


class KTODataSection(PromptResponseDataSection):
    label_key: str = flag("label", "Dataset key of the desirability label (bool or 0/1)")


class KTOConfig(SupervisedConfig):
    """``rlhf train kto``"""

    model: KTOModelSection = Field(default_factory=KTOModelSection)
    data: KTODataSection = Field(default_factory=KTODataSection)
    ref: FrozenModelSection = Field(default_factory=FrozenModelSection)


def desirability(value: Any, source: str, index: int) -> bool:
    """A row's label as a bool: ``true``/``false`` or the numbers 1/0; anything else is a ConfigError."""
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    raise ConfigError(f"{source} row {index}: label {value!r} is not a bool or 0/1 (--data.label_key)")


class KTOTrainer(SupervisedTrainer):
    """KTO: unpaired desirable/undesirable completions against a frozen reference, sample mean per step."""

    config_class: ClassVar[type[KTOConfig]] = KTOConfig
    frozen_sections: ClassVar[tuple[str, ...]] = ("ref",)
    shown_metrics: ClassVar[tuple[str, ...]] = ("loss", "kl")

    def build_examples(self, rows: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
        """Rows -> ``{prompt, response, desirable, length}``; prompt and response are token id lists
        (the response ends with EOS). Runs once per dataset, before training."""
        from rlhf_supervised.conversations import row_prompt_response

        from rlhf.data.sources import row_value

        data = self.config.data
        examples = []
        for index, row in enumerate(rows):
            ids, mask = row_prompt_response(row, data, self.tokenizer, source, index)
            label = desirability(row_value(row, data.label_key, "--data.label_key", source, index), source, index)
            cut = mask.index(1) if 1 in mask else len(ids)
            examples.append({"prompt": ids[:cut], "response": ids[cut:], "desirable": label, "length": len(ids)})
        return examples

    def collate(self, examples: list[dict[str, Any]]) -> Any:
        """N examples -> a batch of 2N sequences (matched, then mismatched), loss mask on completions.

        ``extras``: ``matched`` = N and ``desirable`` = ``(N,)`` bool (on CPU). A mismatched sequence
        is cut to ``--data.max_len``; with N = 1 it is the matched sequence itself.
        """
        import torch
        from rlhf_supervised.batch import collate

        n, limit = len(examples), self.config.data.max_len
        pairs = [(e["prompt"], e["response"]) for e in examples]
        pairs += [(e["prompt"], examples[(i + 1) % n]["response"]) for i, e in enumerate(examples)]
        sequences = [(p + r)[:limit] for p, r in pairs]
        masks = [([0] * len(p) + [1] * len(r))[:limit] for p, r in pairs]
        extras = {"matched": n, "desirable": torch.tensor([e["desirable"] for e in examples], dtype=torch.bool)}
        return collate(sequences, masks, self.pad_id, self.config.ds.packing_samples, extras)

    def units(self, batch: Any) -> float:
        return float(batch.extras["matched"])

    def compute(self, batch: Any, training: bool) -> LossParts:
        """Σ KTO loss over the N matched samples; metrics are sums over them.

        ``kl``: the clamped reference point (all-reduced over ranks, like OpenRLHF); ``desirable_frac``:
        the desirable count; ``desirable_reward_total``/``undesirable_reward_total``: Σ β·log π/π_ref
        over the samples of that kind (logged divided by all samples; evaluation also logs the means
        ``desirable_reward``/``undesirable_reward``).
        """
        import torch

        from rlhf_plugin_kto.losses import kl_estimate, kto_loss

        cfg = self.config.model
        n = batch.extras["matched"]
        desirable = batch.extras["desirable"]
        logps, out = self.sequence_logprobs(self.model, batch)  # (2N,)
        ref_logps, _ = self.sequence_logprobs(self.frozen["ref"], batch)  # (2N,), no grad
        kl = kl_estimate(logps[n:], ref_logps[n:])
        if self.world_size > 1:  # every rank runs the same number of micro-batches, so this pairs up
            torch.distributed.all_reduce(kl)
            kl = kl / self.world_size
        losses = kto_loss(logps[:n], ref_logps[:n], kl, desirable, cfg.beta, cfg.desirable_loss_weight,
                          cfg.undesirable_loss_weight)
        rewards = cfg.beta * (logps[:n] - ref_logps[:n]).detach()
        zero = torch.zeros_like(rewards)
        metrics = {
            "kl": kl.clamp(min=0) * n,
            "desirable_frac": desirable.float().sum(),
            "desirable_reward_total": torch.where(desirable, rewards, zero).sum(),
            "undesirable_reward_total": torch.where(desirable, zero, rewards).sum(),
        }
        return LossParts(losses.sum(), metrics, getattr(out, "aux_loss", None))

    def eval_finished(self, metrics: dict[str, float]) -> dict[str, float]:
        """After every step and evaluation: adds the mean implicit reward of each kind (the totals are averaged over all samples)."""
        frac = metrics.get("desirable_frac", 0.0)
        if frac > 0:
            metrics["desirable_reward"] = metrics["desirable_reward_total"] / frac
        if frac < 1:
            metrics["undesirable_reward"] = metrics["undesirable_reward_total"] / (1 - frac)
        return metrics

    step_finished = eval_finished
