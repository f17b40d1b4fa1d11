"""The value-head model workers: critic (values, trained) and reward model (one reward per sample).

Every method runs inside a Ray actor, once per rollout batch (``values``, ``rewards``, ``train``)
or once per checkpoint; payloads are plain per-sample lists as in ``rlhf.runtime.workers.policy``.
Per-token tensors are ``(B, T)`` over response tokens.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlhf.models.loading import dtype_of, load_tokenizer, load_value_model, token_id, token_values
from rlhf.models.lora import apply_lora, quantization_kwargs
from rlhf.models.saving import save_final
from rlhf.runtime.workers.batch import pad_list
from rlhf.runtime.workers.policy import _ModelWorker, while_awake


class _ValueWorker(_ModelWorker):
    """Shared by the critic and the reward model: a backbone plus a one-output head."""

    head = "score"

    def _action_values(self, batch: Any) -> Any:
        """Values of the prefix before each action token, ``(B, T)``."""

        values = token_values(self.model.module, head=self.head, **batch.model_inputs())
        return batch.at_actions(values) * batch.action_mask


class RewardModelWorker(_ValueWorker):
    role = "reward"

    def setup(self, master_addr: str, master_port: int, path: str) -> None:
        self._init_common(master_addr, master_port)
        self.head = self.config.ds.value_head_prefix

        def load() -> Any:
            return self._load("reward", path, lambda: load_value_model(
                path, dtype_of(self.config), self.config.ds.attn_implementation, self.head, require_head=True,
                experts=self.config.ds.experts_implementation))

        with self.backend_use.watch("evaluated", "while it loaded the reward model"):
            self.model = self.backend.evaluated(load, self.config.reward.offload, self.config.rollout.micro_batch_size)
        model = self.model.module
        self.pad_id = token_id(model, "pad_token_id") or 0
        # --reward.normalize_enable: (r − μ)/σ with the statistics reward-model training stored in its config
        self.normalize = (1.0, 0.0)
        if self.config.reward.normalize_enable:
            mean, std = getattr(model.config, "mean", None), getattr(model.config, "std", None)
            if mean is None or std is None:
                raise ValueError(f"--reward.normalize_enable: {path}/config.json has no 'mean' and 'std'")
            self.normalize = (1.0 / float(std), float(mean))

    def rewards(self, payload: dict[str, list]) -> list[float]:
        """The head's value at the last token of each prompt+response: one reward per sample."""

        def compute(batch: Any) -> Any:
            values = token_values(self.model.module, head=self.head, **batch.model_inputs())
            return batch.at_last_token(values)[:, None].expand(-1, batch.action_mask.shape[1])

        scale, mean = self.normalize
        return [(row[0] - mean) * scale for row in self._per_token_rows(payload, compute)]  # every response has >= 1 token


class CriticWorker(_ValueWorker):
    """Values of the prefix before each action token; trained with the clipped value loss."""

    role = "critic"

    def setup(self, master_addr: str, master_port: int, num_training_steps: int) -> None:
        self._init_common(master_addr, master_port)
        cfg = self.config
        self.head = cfg.ds.value_head_prefix
        def load() -> Any:
            model = load_value_model(cfg.critic.model_name_or_path, dtype_of(cfg), cfg.ds.attn_implementation, self.head,
                                     experts=cfg.ds.experts_implementation, gathered=self.backend.gathered,
                                     **quantization_kwargs(cfg.ds))
            return apply_lora(model, cfg.ds, value_head=self.head)  # OpenRLHF adapts the critic too

        self._trained_model("critic", lambda: self._load("critic", cfg.critic.model_name_or_path, load), num_training_steps)

    def values(self, payload: dict[str, list]) -> list[list[float]]:
        return self._per_token_rows(payload, self._action_values)

    @while_awake
    def train(self, payload: dict[str, list], step: int) -> dict[str, float]:
        """Clipped value loss 0.5·max((V−R)², (V_clip−R)²), one token mean per optimizer step."""
        import torch

        clip = self.config.critic.value_clip
        total, count = 0.0, 0
        for rows, tokens, _, weight in self._training_groups(payload, step, salt=7919):
            batch = self._batch(payload, rows)
            values = self._action_values(batch)
            width = batch.action_mask.shape[1]
            old = pad_list([payload["values"][i] for i in rows], width).to(values.device)
            returns = pad_list([payload["returns"][i] for i in rows], width).to(values.device)
            clipped = old + (values - old).clamp(-clip, clip)
            token_loss = 0.5 * torch.max((values - returns) ** 2, (clipped - returns) ** 2) * batch.action_mask
            self._backward(token_loss.sum() / tokens * self._scale() * weight)
            self._optimizer_step()
            if weight:
                total += float(token_loss.detach().sum() / batch.action_mask.sum().clamp(min=1))
                count += 1
        return {"critic_loss": total / max(count, 1), "critic_lr": self.model.learning_rate()}

    @while_awake
    def save_checkpoint(self, directory: str) -> None:
        self.model.save_checkpoint(directory, tag="critic")

    def save_hf(self, directory: str) -> None:
        """``--critic.save_value_network``: the critic as an HF model with its value head (loadable as a
        reward model) and the actor's tokenizer; every rank calls this (the gather is collective)."""

        tokenizer = load_tokenizer(self.config.actor.model_name_or_path, "--actor.model_name_or_path")
        save_final(self.model, tokenizer, Path(directory), self.rank, {})

    @while_awake
    def load_checkpoint(self, directory: str, writer: str | None = None) -> None:
        self._load_checkpoint(directory, "critic", writer)
