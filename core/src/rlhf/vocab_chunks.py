"""The autograd function behind :func:`rlhf.ops.chunked_logprobs` (imported lazily: this module imports torch).

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

from typing import Any

import torch
from torch.autograd.function import once_differentiable


def _working_dtype(logits: torch.Tensor) -> torch.dtype:
    """fp32, or fp64 for fp64 logits (as :func:`rlhf.ops.as_float`)."""
    return torch.promote_types(logits.dtype, torch.float32)


def _scaled_chunk(flat: torch.Tensor, index: torch.Tensor, temperature: float) -> torch.Tensor:
    """``(C,)`` row indices -> ``(C, V)`` copy of those rows in the working dtype, divided by ``temperature``."""
    rows = flat.index_select(0, index).to(_working_dtype(flat))  # index_select copied already: .to adds no second copy
    return rows.div_(temperature) if temperature != 1.0 else rows


class ChunkedLogSoftmax(torch.autograd.Function):
    """``(logits (R, L, V), index (M,), targets (M,), τ, with_entropy, chunk) -> logp (M,)[, entropy (M,)]``, in
    fp32 (fp64 for fp64 logits).

    ``index`` holds flat positions into ``R·L`` (row · L + position); ``targets`` the token id read
    at each. Differentiable once, with respect to ``logits`` only.
    """

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, index: torch.Tensor, targets: torch.Tensor, temperature: float,
                with_entropy: bool, chunk: int) -> Any:
        flat = logits.reshape(-1, logits.shape[-1])  # a view of the model's contiguous logits
        count = index.shape[0]
        lse = torch.empty(count, dtype=_working_dtype(logits), device=logits.device)
        logp = torch.empty_like(lse)
        entropy = torch.empty_like(lse) if with_entropy else None
        for start in range(0, count, chunk):
            part = slice(start, start + chunk)
            log_p = _scaled_chunk(flat, index[part], temperature)
            lse[part] = torch.logsumexp(log_p, dim=-1)
            log_p.sub_(lse[part, None])
            logp[part] = log_p.gather(-1, targets[part, None]).squeeze(-1)
            if entropy is not None:
                entropy[part] = -(log_p.exp().mul_(log_p)).sum(-1)
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
            log_p = _scaled_chunk(flat, index[part], ctx.temperature).sub_(lse[part, None])
            p = log_p.exp()
            g_logp = grad_logp[part, None]
            if entropy is not None:  # −g_H·p·(log p + H) − g_logp·p, in place of log p
                dz = log_p.add_(entropy[part, None]).mul_(grad_entropy[part, None]).add_(g_logp).mul_(p).neg_()
            else:
                dz = p.mul_(g_logp).neg_()
            dz.scatter_add_(-1, targets[part, None], g_logp)
            if ctx.temperature != 1.0:
                dz.div_(ctx.temperature)
            grad_flat.index_add_(0, index[part], dz.to(grad.dtype))
        return grad, None, None, None, None, None
