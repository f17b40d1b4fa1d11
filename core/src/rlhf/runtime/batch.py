"""Rollout samples and the padded tensors the model workers compute on.

A sample is token-in-token-out: the prompt ids the rollout engine saw and the
response ids it produced, with the engine's per-token log-probs. A multi-turn
response interleaves model tokens with environment-feedback tokens; its
``action_mask`` (one 0/1 per response token) marks the model's, and only those are
trained on. Workers build
``(B, L)`` right-padded ``input_ids`` from them and read action positions back
as ``(B, T)`` tensors, ``T`` = longest response in the batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass
class Sample:
    """One response to one prompt. ``group`` indexes the prompt inside its rollout batch."""

    prompt_ids: list[int]
    response_ids: list[int]
    rollout_logprobs: list[float]
    prompt: str = ""
    response: str = ""
    label: Any = None
    group: int = 0
    finish_reason: str = "stop"
    reward: float = 0.0
    score: float = 0.0
    #: 1 for model tokens, 0 for environment feedback; None: every response token is the model's
    action_mask: list[int] | None = None
    #: what an agent's environment returned (``reward``, ``score``, ``extra_logs``, ``error``) when the
    #: executor rewards its own episodes; None otherwise
    agent: dict[str, Any] | None = None

    def mask(self) -> list[int]:
        return self.action_mask if self.action_mask is not None else [1] * len(self.response_ids)


@dataclass
class TokenBatch:
    """Padded tensors for a list of samples (built inside workers)."""

    input_ids: torch.Tensor  # (B, L) right-padded prompt+response
    attention_mask: torch.Tensor  # (B, L)
    action_index: torch.Tensor  # (B, T) positions whose next token is the action token
    action_mask: torch.Tensor  # (B, T) 1 for the model's response tokens (not padding, not env feedback)
    actions: torch.Tensor  # (B, T) response token ids (0 where masked)


def pack(prompt_ids: list[list[int]], response_ids: list[list[int]], pad_id: int,
         action_masks: list[list[int] | None] | None = None) -> TokenBatch:
    """Right-padded tensors of ``prompt + response`` rows, built with one tensor copy of all the
    tokens (a per-row loop of small tensor writes cost more than the model on tiny batches).
    ``action_masks`` (one 0/1 per response token, None for all 1) zero the environment's tokens."""
    import torch

    prompt_len = torch.tensor([len(p) for p in prompt_ids])
    response_len = torch.tensor([len(r) for r in response_ids])
    seq_len = prompt_len + response_len
    length, actions_len = int(seq_len.max()), max(1, int(response_len.max()))
    attention = torch.arange(length) < seq_len[:, None]
    input_ids = torch.full(attention.shape, pad_id, dtype=torch.long)
    input_ids[attention] = torch.tensor([t for p, r in zip(prompt_ids, response_ids) for t in (*p, *r)], dtype=torch.long)
    steps = torch.arange(actions_len)
    action_mask = steps < response_len[:, None]
    action_index = (prompt_len[:, None] - 1 + steps) * action_mask
    actions = input_ids.gather(1, (action_index + 1).clamp(max=length - 1)) * action_mask
    action_mask = action_mask.float()
    if action_masks is not None and any(m is not None for m in action_masks):
        given = [m if m is not None else [1] * len(r) for m, r in zip(action_masks, response_ids)]
        action_mask = action_mask * pad_list(given, actions_len)
    return TokenBatch(input_ids, attention.long(), action_index, action_mask, actions)


def action_logits(logits: torch.Tensor, batch: TokenBatch, temperature: float = 1.0) -> torch.Tensor:
    """Temperature-scaled logits of the positions that predict each action token: ``(B, L, V) -> (B, T, V)``."""
    import torch

    index = batch.action_index.unsqueeze(-1).expand(-1, -1, logits.shape[-1])
    return torch.gather(logits, 1, index).float() / temperature


def action_logprobs(logits: torch.Tensor, batch: TokenBatch, temperature: float = 1.0) -> torch.Tensor:
    """Log-probs of the action tokens under temperature-scaled logits: ``(B, L, V) -> (B, T)``."""
    import torch

    logp = torch.log_softmax(action_logits(logits, batch, temperature), dim=-1)
    return torch.gather(logp, -1, batch.actions.unsqueeze(-1)).squeeze(-1) * batch.action_mask


def pad_list(rows: list[list[float]], width: int) -> torch.Tensor:
    """``(len(rows), width)`` float32, each row left-aligned and zero-padded (rows are at most ``width`` long)."""
    import torch

    lengths = torch.tensor([len(row) for row in rows], dtype=torch.long)
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    out[torch.arange(width) < lengths[:, None]] = torch.tensor([x for row in rows for x in row], dtype=torch.float32)
    return out
