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

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlhf.media import collate_media
from rlhf.ops import chunked_logprobs
from rlhf.payloads import WorkerColumns

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
    #: the dataset row's fields beside the input and the label (``--data.input_key``, ``--data.label_key``)
    fields: dict[str, Any] = dataclasses.field(default_factory=dict)
    group: int = 0
    finish_reason: str = "stop"
    reward: float = 0.0
    score: float = 0.0
    #: 1 for model tokens, 0 for environment feedback; None: every response token is the model's
    action_mask: list[int] | None = None
    #: what an agent's environment returned (``reward``, ``score``, ``extra_logs``, ``error``) when the
    #: executor rewards its own episodes; None otherwise
    agent: dict[str, Any] | None = None
    media: dict[str, Any] | None = None  # the prompt's processed images (see collate_media), VLM prompts only
    #: the prompt schedule's position just after this sample's prompt (PromptSchedule hands it out); None for eval
    data_state: dict[str, int] | None = None
    #: each reward term's unweighted value (``reward/<term>``) and the columns reward functions or the agent executor
    #: added (``extra/<term>/<name>``), as the reward manager answered (rlhf.records.rollouts)
    terms: dict[str, float] = dataclasses.field(default_factory=dict)
    columns: dict[str, Any] = dataclasses.field(default_factory=dict)
    policy_version: int = 0  # weight syncs before this sample was generated
    #: what model extensions recorded while the engine generated it (``GenerationResult.token_records``); None: nothing
    token_records: dict[str, Any] | None = None

    def mask(self) -> list[int]:
        return self.action_mask if self.action_mask is not None else [1] * len(self.response_ids)


def worker_payload(samples: list[Sample]) -> WorkerColumns:
    """The columns every model worker reads: token ids, the prompts' media and the multi-turn action masks when there are any."""
    payload: WorkerColumns = {"prompt_ids": [s.prompt_ids for s in samples],
                                       "response_ids": [s.response_ids for s in samples]}
    if any(s.media for s in samples):
        payload["media"] = [s.media for s in samples]
    if any(s.action_mask is not None for s in samples):  # multi-turn: environment tokens are not trained on
        payload["action_masks"] = [s.action_mask for s in samples]
    if any(s.token_records for s in samples):  # e.g. the experts the engine routed each token to (rlhf-plugin-moe-replay)
        payload["token_records"] = [s.token_records for s in samples]
    return payload


@dataclass
class TokenBatch:
    """Tensors of a list of samples (built inside workers): ``B`` right-padded rows, or with
    ``--ds.packing_samples`` one packed row of all ``ΣLᵢ`` tokens whose position ids restart at 0
    for every sample (no padding, no attention mask: transformers builds the per-sample causal
    mask from the position ids, which flash-attn runs as varlen attention)."""

    input_ids: torch.Tensor  # (B, L) right-padded prompt+response, or (1, ΣLᵢ) packed
    attention_mask: torch.Tensor | None  # (B, L); None when packed
    position_ids: torch.Tensor | None  # (1, ΣLᵢ) restarting at 0 per sample when packed; None when padded
    rows: torch.Tensor  # (B,) the row of input_ids holding each sample (all 0 when packed)
    last_index: torch.Tensor  # (B,) position of each sample's last token in its row
    action_index: torch.Tensor  # (B, T) positions (in the sample's row) whose next token is the action token
    action_mask: torch.Tensor  # (B, T) 1 for the model's response tokens (not padding, not env feedback)
    actions: torch.Tensor  # (B, T) response token ids (0 where masked)
    media: dict[str, Any] | None = None  # extra forward inputs of the samples' images (collate_media)

    def model_inputs(self) -> dict[str, Any]:
        """Keyword arguments of the HF forward; no KV cache (a cache would switch off packed-sequence masking)."""
        if self.position_ids is not None:
            return {"input_ids": self.input_ids, "position_ids": self.position_ids, "use_cache": False}
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask, "use_cache": False, **(self.media or {})}

    def to(self, device: Any) -> TokenBatch:
        """This batch with every tensor (media included) on ``device``: the model's, before its forward
        (a batch is built on the CPU, where its lists arrive; a model on a GPU refuses CPU inputs)."""
        def move(value: Any) -> Any:
            if isinstance(value, dict):
                return {key: move(item) for key, item in value.items()}
            return value.to(device, non_blocking=True) if hasattr(value, "to") else value

        return dataclasses.replace(self, **{field.name: move(getattr(self, field.name)) for field in dataclasses.fields(self)})

    def at_actions(self, per_position: torch.Tensor) -> torch.Tensor:
        """``(R, L, ...) -> (B, T, ...)``: the values at the positions that predict each action token."""
        return per_position[self.rows[:, None], self.action_index]

    def at_last_token(self, per_position: torch.Tensor) -> torch.Tensor:
        """``(R, L, ...) -> (B, ...)``: each sample's value at its last token (the reward-model readout)."""
        return per_position[self.rows, self.last_index]


def pack(prompt_ids: list[list[int]], response_ids: list[list[int]], pad_id: int, packed: bool = False,
         media: list[dict[str, Any] | None] | None = None,
         action_masks: list[list[int] | None] | None = None) -> TokenBatch:
    """``prompt + response`` rows, right-padded (or packed into one row), built with one tensor copy of
    all the tokens (a per-row loop of small tensor writes cost more than the model on tiny batches);
    ``media``: each sample's images (VLM prompts; padded rows only); ``action_masks`` (one 0/1 per
    response token, None for all 1) zero the environment's tokens of multi-turn responses."""
    import torch

    prompt_len = torch.tensor([len(p) for p in prompt_ids])
    response_len = torch.tensor([len(r) for r in response_ids])
    seq_len = prompt_len + response_len
    flat = torch.tensor([t for p, r in zip(prompt_ids, response_ids) for t in (*p, *r)], dtype=torch.long)
    actions_len = max(1, int(response_len.max()))
    steps = torch.arange(actions_len)
    action_mask = steps < response_len[:, None]
    if packed:
        starts = seq_len.cumsum(0) - seq_len
        input_ids = flat.unsqueeze(0)
        position_ids = torch.cat([torch.arange(int(n)) for n in seq_len]).unsqueeze(0)
        rows = torch.zeros(len(seq_len), dtype=torch.long)
        offset, attention = starts, None
    else:
        length = int(seq_len.max())
        mask = torch.arange(length) < seq_len[:, None]
        input_ids = torch.full(mask.shape, pad_id, dtype=torch.long)
        input_ids[mask] = flat
        position_ids, rows = None, torch.arange(len(seq_len))
        offset, attention = torch.zeros_like(seq_len), mask.long()
    action_index = (offset[:, None] + prompt_len[:, None] - 1 + steps) * action_mask
    width = input_ids.shape[1]
    actions = input_ids[rows[:, None], (action_index + 1).clamp(max=width - 1)] * action_mask
    action_mask = action_mask.float()
    if action_masks is not None and any(m is not None for m in action_masks):
        given = [m if m is not None else [1] * len(r) for m, r in zip(action_masks, response_ids)]
        action_mask = action_mask * pad_list(given, actions_len)
    return TokenBatch(input_ids, attention, position_ids, rows, offset + seq_len - 1, action_index, action_mask,
                      actions, collate_media(media) if media else None)


def action_logprobs(logits: torch.Tensor, batch: TokenBatch, temperature: float = 1.0,
                    with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of the action tokens under temperature-scaled logits, and with ``with_entropy`` the
    entropy of each action position's distribution: ``(R, L, V) -> ((B, T), (B, T) or None)``, fp32,
    0 where the action mask is 0. Chunked over the action tokens (:func:`rlhf.ops.chunked_logprobs`):
    no ``(B, T, V)`` fp32 tensor, in the forward or the backward."""
    return chunked_logprobs(logits, batch.rows[:, None], batch.action_index, batch.actions, mask=batch.action_mask,
                            temperature=temperature, with_entropy=with_entropy)


def pad_list(rows: list[list[float]], width: int) -> torch.Tensor:
    """``(len(rows), width)`` float32, each row left-aligned and zero-padded (rows are at most ``width`` long)."""
    import torch

    lengths = torch.tensor([len(row) for row in rows], dtype=torch.long)
    out = torch.zeros((len(rows), width), dtype=torch.float32)
    out[torch.arange(width) < lengths[:, None]] = torch.tensor([x for row in rows for x in row], dtype=torch.float32)
    return out
