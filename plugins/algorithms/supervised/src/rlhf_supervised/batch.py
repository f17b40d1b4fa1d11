"""Token batches of supervised trainers, padded or packed, and the per-token/per-sample reads.

Padded: ``(N, L)`` right-padded rows with an attention mask. Packed
(``--ds.packing_samples``): one ``(1, ΣLᵢ)`` row with no padding, ``position_ids``
restarting at 0 for every sample and no attention mask, from which transformers builds
a block-diagonal causal mask (flash-attn varlen on GPU, a masked sdpa/eager kernel on
CPU), so no sample attends to another.

Every tensor below is aligned with ``input_ids``: position ``t`` holds a value about
token ``t`` (its log-prob given the tokens before it in the same sample, its loss mask,
the sample it belongs to).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


@dataclass
class SupervisedBatch:
    input_ids: torch.Tensor  # (R, L): R = N padded rows, or 1 packed row
    attention_mask: torch.Tensor | None  # (R, L); None when packed
    position_ids: torch.Tensor | None  # (1, L) when packed; None when padded
    loss_mask: torch.Tensor  # (R, L) float: 1 where token t is trained (never a sample's first token)
    sample_ids: torch.Tensor  # (R, L) long: the sample each position belongs to, -1 on padding
    last_index: torch.Tensor  # (N,) long: flat index into (R·L) of each sample's last token
    num_samples: int
    extras: dict[str, Any] = field(default_factory=dict)  # per-sample values a trainer attached (labels…)

    def model_inputs(self) -> dict[str, Any]:
        """Keyword arguments of the HF forward."""
        if self.position_ids is not None:
            return {"input_ids": self.input_ids, "position_ids": self.position_ids, "use_cache": False}
        return {"input_ids": self.input_ids, "attention_mask": self.attention_mask, "use_cache": False}

    def to(self, device: Any) -> SupervisedBatch:
        def move(t: Any) -> Any:
            return t.to(device) if t is not None else None

        extras = {k: v.to(device) if hasattr(v, "to") else v for k, v in self.extras.items()}
        return SupervisedBatch(move(self.input_ids), move(self.attention_mask), move(self.position_ids),
                               move(self.loss_mask), move(self.sample_ids), move(self.last_index), self.num_samples,
                               extras)


def collate(sequences: list[list[int]], masks: list[list[float]], pad_id: int, packed: bool,
            extras: dict[str, Any] | None = None) -> SupervisedBatch:
    """Build a batch from token lists and their loss masks (same lengths)."""
    import torch

    lengths = [len(s) for s in sequences]
    if packed:
        input_ids = torch.tensor([tok for s in sequences for tok in s], dtype=torch.long).unsqueeze(0)
        position_ids = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
        loss_mask = torch.tensor([float(v) for m in masks for v in m]).unsqueeze(0)
        sample_ids = torch.cat([torch.full((n,), i, dtype=torch.long) for i, n in enumerate(lengths)]).unsqueeze(0)
        ends = torch.tensor(lengths).cumsum(0)
        loss_mask[0, ends - torch.tensor(lengths)] = 0.0
        return SupervisedBatch(input_ids, None, position_ids, loss_mask, sample_ids, ends - 1, len(sequences),
                               extras or {})
    width = max(lengths)
    rows = len(sequences)
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    attention = torch.zeros((rows, width), dtype=torch.long)
    loss_mask = torch.zeros((rows, width))
    sample_ids = torch.full((rows, width), -1, dtype=torch.long)
    for i, (seq, mask) in enumerate(zip(sequences, masks)):
        input_ids[i, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attention[i, : len(seq)] = 1
        loss_mask[i, : len(seq)] = torch.tensor([float(v) for v in mask])
        sample_ids[i, : len(seq)] = i
    loss_mask[:, 0] = 0.0
    last_index = torch.arange(rows) * width + torch.tensor(lengths) - 1
    return SupervisedBatch(input_ids, attention, None, loss_mask, sample_ids, last_index, rows, extras or {})


def token_logprobs(logits: torch.Tensor, batch: SupervisedBatch, temperature: float = 1.0) -> torch.Tensor:
    """``(R, L, V) -> (R, L)`` fp32: log p(token t | tokens before it); 0 where t starts a sample and on padding.
    Chunked over the positions (:func:`rlhf.ops.chunked_logprobs`): no ``(R, L, V)`` fp32 tensor."""
    import torch

    from rlhf.ops import chunked_logprobs

    rows, width = batch.input_ids.shape
    sample = batch.sample_ids
    within_a_sample = (sample[:, 1:] >= 0) & (sample[:, 1:] == sample[:, :-1])  # a packed row's next sample starts fresh
    logp, _ = chunked_logprobs(logits, torch.arange(rows, device=logits.device)[:, None],
                               torch.arange(width - 1, device=logits.device), batch.input_ids[:, 1:],
                               mask=within_a_sample, temperature=temperature)
    return torch.nn.functional.pad(logp, (1, 0))


def per_sample_sum(values: torch.Tensor, batch: SupervisedBatch, weights: torch.Tensor | None = None) -> torch.Tensor:
    """``(R, L) -> (N,)``: the sum over each sample's positions of ``values · weights`` (default: the loss mask)."""
    import torch

    weighted = values * (batch.loss_mask if weights is None else weights)
    ids = batch.sample_ids.clamp(min=0).flatten()
    out = torch.zeros(batch.num_samples, dtype=weighted.dtype, device=weighted.device)
    return out.index_add(0, ids, (weighted * (batch.sample_ids >= 0)).flatten())


def at_last_token(values: torch.Tensor, batch: SupervisedBatch) -> torch.Tensor:
    """``(R, L) -> (N,)``: each sample's value at its last token (the reward-model readout)."""
    return values.flatten()[batch.last_index]


def collate_pairs(examples: list[dict[str, Any]], pad_id: int, packed: bool) -> SupervisedBatch:
    """Preference pairs in one forward: samples ``0..N-1`` are the chosen responses, ``N..2N-1``
    the rejected ones (``extras["margin"]``: ``(N,)`` floats)."""
    sequences = [e["chosen_ids"] for e in examples] + [e["rejected_ids"] for e in examples]
    masks = [e["chosen_mask"] for e in examples] + [e["rejected_mask"] for e in examples]
    return collate(sequences, masks, pad_id, packed, {"margin": [e["margin"] for e in examples]})
