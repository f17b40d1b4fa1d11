"""Rollout samples and the padded tensors the model workers compute on.

A sample is token-in-token-out: the prompt ids the rollout engine saw and the
response ids it produced, with the engine's per-token log-probs. Workers build
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


@dataclass
class TokenBatch:
    """Padded tensors for a list of samples (built inside workers)."""

    input_ids: torch.Tensor  # (B, L) right-padded prompt+response
    attention_mask: torch.Tensor  # (B, L)
    action_index: torch.Tensor  # (B, T) positions whose next token is the action token
    action_mask: torch.Tensor  # (B, T) 1 for real response tokens
    actions: torch.Tensor  # (B, T) response token ids (0 where masked)


def pack(prompt_ids: list[list[int]], response_ids: list[list[int]], pad_id: int) -> TokenBatch:
    import torch

    seqs = [p + r for p, r in zip(prompt_ids, response_ids)]
    length = max(len(s) for s in seqs)
    actions_len = max(1, max(len(r) for r in response_ids))
    batch = len(seqs)
    input_ids = torch.full((batch, length), pad_id, dtype=torch.long)
    attention = torch.zeros((batch, length), dtype=torch.long)
    action_index = torch.zeros((batch, actions_len), dtype=torch.long)
    action_mask = torch.zeros((batch, actions_len), dtype=torch.float32)
    actions = torch.zeros((batch, actions_len), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_ids, response_ids)):
        seq = p + r
        input_ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention[i, : len(seq)] = 1
        if r:
            action_index[i, : len(r)] = torch.arange(len(p) - 1, len(p) - 1 + len(r))
            action_mask[i, : len(r)] = 1.0
            actions[i, : len(r)] = torch.tensor(r, dtype=torch.long)
    return TokenBatch(input_ids, attention, action_index, action_mask, actions)


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
    import torch

    out = torch.zeros((len(rows), width), dtype=torch.float32)
    for i, row in enumerate(rows):
        if row:
            out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out
