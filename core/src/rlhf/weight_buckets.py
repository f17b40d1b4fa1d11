"""Buckets of weights, the unit streaming weight-sync transports send (public plugin API).

A sync's *layout* is every tensor it sends, in order, as ``(HF name, full shape, torch dtype name)``;
it is split into consecutive runs of one dtype of at most ``BUCKET_BYTES`` (``RLHF_SYNC_BUCKET_MB``,
default 64), each sent as one flat tensor. Both sides compute the same split from the same layout,
so only the flat tensors travel.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

BUCKET_BYTES = int(os.environ.get("RLHF_SYNC_BUCKET_MB", "64")) << 20

#: one tensor of the layout: (name, shape, dtype name)
Entry = tuple[str, tuple[int, ...], str]


def buckets(layout: list[Entry], bucket_bytes: int = BUCKET_BYTES) -> list[list[Entry]]:
    """Consecutive runs of one dtype, each at most ``bucket_bytes`` (a larger tensor goes alone)."""
    import torch

    result: list[list[Entry]] = []
    size = 0
    for entry in layout:
        nbytes = numel(entry[1]) * getattr(torch, entry[2]).itemsize
        if not result or result[-1][0][2] != entry[2] or size + nbytes > bucket_bytes:
            result.append([])
            size = 0
        result[-1].append(entry)
        size += nbytes
    return result


def numel(shape: tuple[int, ...]) -> int:
    """How many elements a tensor of ``shape`` holds."""
    count = 1
    for dim in shape:
        count *= dim
    return count


def flatten(tensors: list[Any], device: Any) -> Any:
    """One bucket's tensors as one new flat tensor on ``device``."""
    import torch

    return torch.cat([t.detach().reshape(-1) for t in tensors]).to(device)


def unflatten(flat: Any, bucket: list[Entry]) -> Iterator[tuple[str, Any]]:
    """``(name, view)`` of every tensor of ``bucket`` inside its flat tensor."""
    offset = 0
    for name, shape, _ in bucket:
        count = numel(shape)
        yield name, flat[offset:offset + count].view(shape)
        offset += count
