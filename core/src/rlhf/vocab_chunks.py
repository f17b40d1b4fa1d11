"""The autograd function behind :func:`rlhf.ops.chunked_logprobs`, built on first use (:func:`chunked_log_softmax`)
so that importing this module does not import torch.

It reads ``M`` selected rows of a model's ``(R, L, V)`` logits a chunk of positions at a time, so
the only vocabulary-sized tensors are the logits themselves, their gradient (which autograd needs
anyway) and one ``(chunk, V)`` fp32 chunk with its temporaries. What it keeps for the backward is
``M``-sized: the log-normaliser of each row and, with entropy, the entropy; the backward
recomputes each chunk's softmax from the logits.

Per selected row, with ``z = logits / τ`` in fp32 (fp64 logits stay fp64), ``lse = logsumexp(z)``, ``log p = z − lse``::

    logp_a = log p_a                       d logp_a / d z_j = 1[j = a] − p_j
    H      = −Σ_j p_j · log p_j            d H / d z_j      = −p_j · (log p_j + H)

and each gradient with respect to the logits is the one above divided by τ.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


def _working_dtype(logits: torch.Tensor) -> torch.dtype:
    """fp32, or fp64 for fp64 logits (as :func:`rlhf.ops.as_float`)."""
    import torch

    return torch.promote_types(logits.dtype, torch.float32)


def _scaled_chunk(flat: torch.Tensor, index: torch.Tensor, temperature: float) -> torch.Tensor:
    """``(C,)`` row indices -> ``(C, V)`` copy of those rows in the working dtype, divided by ``temperature``."""
    rows = flat.index_select(0, index).to(_working_dtype(flat))  # index_select copied already: .to adds no second copy
    return rows.div_(temperature) if temperature != 1.0 else rows


def _chunk_forward(flat: torch.Tensor, index: torch.Tensor, targets: torch.Tensor, temperature: float,
                   with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One chunk's ``(lse, logp, entropy or None)``, each ``(C,)``; its ``(C, V)`` tensors die on return."""
    import torch

    log_p = _scaled_chunk(flat, index, temperature)
    lse = torch.logsumexp(log_p, dim=-1)
    log_p.sub_(lse[:, None])
    logp = log_p.gather(-1, targets[:, None]).squeeze(-1)
    return lse, logp, -(log_p.exp().mul_(log_p)).sum(-1) if with_entropy else None


def _chunk_logits_grad(flat: torch.Tensor, index: torch.Tensor, targets: torch.Tensor, temperature: float,
                       lse: torch.Tensor, grad_logp: torch.Tensor, entropy: torch.Tensor | None,
                       grad_entropy: torch.Tensor | None) -> torch.Tensor:
    """One chunk's gradient with respect to its rows of the logits, ``(C, V)`` in the working dtype."""
    log_p = _scaled_chunk(flat, index, temperature).sub_(lse[:, None])
    p = log_p.exp()
    g_logp = grad_logp[:, None]
    if entropy is not None:  # −g_H·p·(log p + H) − g_logp·p, in place of log p
        dz = log_p.add_(entropy[:, None]).mul_(grad_entropy[:, None]).add_(g_logp).mul_(p).neg_()
    else:
        dz = p.mul_(g_logp).neg_()
    dz.scatter_add_(-1, targets[:, None], g_logp)
    return dz.div_(temperature) if temperature != 1.0 else dz


@functools.cache
def chunked_log_softmax() -> Any:
    """The :class:`torch.autograd.Function` below (one class per process, made at the first call)."""
    import torch
    from torch.autograd.function import once_differentiable

    class ChunkedLogSoftmax(torch.autograd.Function):
        """``(logits (R, L, V), index (M,), targets (M,), τ, with_entropy, chunk) -> logp (M,)[, entropy (M,)]``, in
        fp32 (fp64 for fp64 logits).

        ``index`` holds flat positions into ``R·L`` (row · L + position); ``targets`` the token id read
        at each. Differentiable once, with respect to ``logits`` only. Each chunk is computed in a
        function of its own, so its ``(C, V)`` tensors are freed before the next chunk's are made.
        """

        @staticmethod
        def forward(ctx: Any, logits: torch.Tensor, index: torch.Tensor, targets: torch.Tensor, temperature: float,
                    with_entropy: bool, chunk: int) -> Any:
            flat = logits.reshape(-1, logits.shape[-1])  # a view of the model's contiguous logits
            parts = [_chunk_forward(flat, index[start:start + chunk], targets[start:start + chunk], temperature, with_entropy)
                     for start in range(0, index.shape[0], chunk)]
            empty = flat.new_empty(0, dtype=_working_dtype(flat))
            lse, logp = (torch.cat([part[k] for part in parts]) if parts else empty for k in (0, 1))
            entropy = (torch.cat([part[2] for part in parts]) if parts else empty) if with_entropy else None
            ctx.temperature, ctx.chunk = temperature, chunk
            ctx.save_for_backward(logits, index, targets, lse, entropy)
            return (logp, entropy) if entropy is not None else logp

        @staticmethod
        @once_differentiable
        def backward(ctx: Any, grad_logp: torch.Tensor, grad_entropy: torch.Tensor | None = None) -> Any:
            logits, index, targets, lse, entropy = ctx.saved_tensors
            if not ctx.needs_input_grad[0]:
                return None, None, None, None, None, None
            grad = torch.zeros_like(logits, memory_format=torch.contiguous_format)
            flat, grad_flat = logits.reshape(-1, logits.shape[-1]), grad.view(-1, logits.shape[-1])
            for start in range(0, index.shape[0], ctx.chunk):
                part = slice(start, start + ctx.chunk)
                chunk_grad = _chunk_logits_grad(flat, index[part], targets[part], ctx.temperature, lse[part], grad_logp[part],
                                                None if entropy is None else entropy[part],
                                                None if entropy is None else grad_entropy[part])
                grad_flat.index_add_(0, index[part], chunk_grad.to(grad.dtype))
            return grad, None, None, None, None, None

    return ChunkedLogSoftmax
