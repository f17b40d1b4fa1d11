"""How a worker splits its samples into forward passes: fixed-size micro-batches, or (with
``--train.dynamic_batch_enable``) micro-batches filled up to a token budget; and whether a
micro-batch runs packed (``--ds.packing_samples``).

Every rank of a ZeRO group must run the same number of forward passes (ZeRO-3 gathers the
parameters collectively inside each forward, ZeRO-2 reduces gradients inside each backward), so a
token budget that gives one rank fewer micro-batches splits its largest ones (or, when it has too
few samples, runs zero-weight passes) until every rank has the same count.

Runs inside the model workers, once per rollout batch (forward passes) or optimizer step (training).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from rlhf.models.loading import attn_implementation

if TYPE_CHECKING:
    from rlhf.config.ppo import PPOConfig

log = logging.getLogger("rlhf.runtime")

#: An empty micro-batch: the rank runs a forward (and backward) on a stand-in sample whose
#: result it discards, so its collectives pair with the other ranks'.
FILLER: list[int] = []


def fixed_size(indices: list[int], size: int) -> list[list[int]]:
    return [indices[i : i + size] for i in range(0, len(indices), size)]


def token_budget(indices: list[int], lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Consecutive samples while their total length stays within ``max_tokens``; a longer sample alone."""
    batches: list[list[int]] = []
    used = 0
    for i in indices:
        if batches and used + lengths[i] <= max_tokens:
            batches[-1].append(i)
            used += lengths[i]
        else:
            batches.append([i])
            used = lengths[i]
    return batches


def split_to(batches: list[list[int]], lengths: list[int], count: int) -> list[list[int]]:
    """Split the micro-batch with the most tokens in two until there are ``count``; when every one
    holds a single sample, add :data:`FILLER` passes."""
    batches = [list(b) for b in batches]
    while len(batches) < count:
        splittable = [k for k, b in enumerate(batches) if len(b) > 1]
        if not splittable:
            batches += [FILLER] * (count - len(batches))
            break
        k = max(splittable, key=lambda j: sum(lengths[i] for i in batches[j]))
        half = len(batches[k]) // 2
        batches[k : k + 1] = [batches[k][:half], batches[k][half:]]
    return batches


def same_count_on_every_rank(batches: list[list[int]], lengths: list[int], world_size: int,
                             device: Any = None) -> list[list[int]]:
    """Raise this rank's number of micro-batches to the largest of the group (one all-reduce, on ``device``:
    the model's, where the group's backend reduces; NCCL takes no CPU tensor)."""
    if world_size == 1:
        return batches
    import torch
    import torch.distributed as dist

    count = torch.tensor([len(batches)], device=device)
    dist.all_reduce(count, op=dist.ReduceOp.MAX)
    return split_to(batches, lengths, int(count))


def plan(indices: list[int], lengths: list[int], size: int, max_tokens: int | None, world_size: int,
         device: Any = None) -> list[list[int]]:
    """Micro-batches of ``indices``: by token budget when ``max_tokens`` is set (dynamic batching),
    else ``size`` samples each; the same count on every rank (agreed on ``device``, the model's)."""
    batches = token_budget(indices, lengths, max_tokens) if max_tokens else fixed_size(indices, size)
    return same_count_on_every_rank(batches, lengths, world_size, device) if max_tokens else batches


def packed_forward(config: PPOConfig) -> bool:
    """Whether ``--ds.packing_samples`` runs as one packed row per micro-batch.

    Packed rows pay off with flash-attn's varlen kernel; without it (CPU machines) transformers masks
    a packed row with a dense (ΣL)² block-diagonal mask, which measured slower than padding
    (benchmarks/sft_packing.py), so there the micro-batches run padded: the same numbers, faster.
    """
    if not config.ds.packing_samples:
        return False

    if attn_implementation(config.ds.attn_implementation).startswith("flash"):
        return True
    log.info("--ds.packing_samples without flash-attn: forward passes run padded (faster than a dense-mask "
             "packed row here); dynamic batching still fills micro-batches by tokens")
    return False
