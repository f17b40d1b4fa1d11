"""Random inputs shaped like the runtime's: right-padded action masks, grouped rewards, log-probs.

Every generator takes a seed so a failing case can be reproduced, and the sizes are
listed smallest first (``SIZES``) so kits report the smallest failing input.
"""

from __future__ import annotations

from typing import Any

from rlhf.testing.conformance._core import show

#: ``(P prompts, n samples per prompt, T action tokens)``, smallest first.
SIZES = ((1, 2, 1), (1, 2, 3), (2, 3, 4), (3, 4, 7))


def generator(seed: int) -> Any:
    import torch

    return torch.Generator().manual_seed(seed)


def right_padded_mask(lengths: list[int], width: int) -> Any:
    """``(B, T)`` float mask with ``lengths[i]`` leading ones (0 = an empty response)."""
    import torch

    return (torch.arange(width)[None, :] < torch.tensor(lengths)[:, None]).float()


def random_lengths(batch: int, width: int, seed: int, *, with_empty: bool = False) -> list[int]:
    """Response lengths in [1, T] (the last one 0 when ``with_empty``)."""
    import torch

    lengths = torch.randint(1, width + 1, (batch,), generator=generator(seed)).tolist()
    if with_empty:
        lengths[-1] = 0
    return lengths


def randn(*shape: int, seed: int, scale: float = 1.0) -> Any:
    import torch

    return torch.randn(*shape, generator=generator(seed)) * scale


def garbage_where_masked(values: Any, mask: Any, seed: int, scale: float = 50.0) -> Any:
    """``values`` with large finite noise at the padding positions (the runtime leaves 0 there,
    but a component must not read them at all)."""
    noise = randn(*values.shape, seed=seed + 7919, scale=scale).to(values.dtype)
    return values * mask.to(values.dtype) + noise * (1 - mask.to(values.dtype))


def at_least_fp32(dtype: Any) -> Any:
    import torch

    return torch.promote_types(dtype, torch.float32)


def describe(**parts: Any) -> str:
    return ", ".join(f"{name}={show(value)}" for name, value in parts.items())
