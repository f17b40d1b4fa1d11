"""Masked tensor math shared by algorithm plugins (one implementation, many estimators/losses).

Shapes: ``values`` and ``mask`` are ``(B, T)``; reductions over ``dim`` follow torch.
All results are computed in at least fp32, whatever the input dtype.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlhf.vocab_chunks import chunked_log_softmax

if TYPE_CHECKING:
    import torch

    from rlhf.components import KLEstimator


def as_float(x: torch.Tensor) -> torch.Tensor:
    """Promote to at least fp32 (bf16/fp16 -> fp32, fp64 stays fp64)."""
    import torch

    return x.to(torch.promote_types(x.dtype, torch.float32))


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Σ values·mask / Σ mask over ``dim`` (all elements when None); 0 where the mask is empty."""
    values, mask = as_float(values), as_float(mask)
    total = (values * mask).sum() if dim is None else (values * mask).sum(dim)
    count = mask.sum() if dim is None else mask.sum(dim)
    return total / count.clamp(min=1)


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, *, shift_mean: bool = True, std_norm: bool = True) -> torch.Tensor:
    """Global masked whitening: (A − μ)·rsqrt(max(σ², 1e−8)) with μ, σ² the masked mean and
    biased variance over every masked element; ``std_norm=False`` keeps only the mean shift."""
    import torch

    values = as_float(values)
    mean = masked_mean(values, mask)
    out = values - mean if shift_mean else values
    if std_norm:
        var = masked_mean((values - mean) ** 2, mask)
        out = out * torch.rsqrt(var.clamp(min=1e-8))
    return out


def discounted_returns(token_rewards: torch.Tensor, action_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = Σ_{k≥t} γ^{k−t} r_k over masked tokens, ``(B, T) -> (B, T)``, zero where masked."""
    import torch

    rewards = as_float(token_rewards) * action_mask
    returns = torch.zeros_like(rewards)
    running = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(rewards.shape[1])):
        running = rewards[:, t] + gamma * running
        returns[:, t] = running
    return returns * action_mask


def compute_approx_kl(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, estimator: KLEstimator) -> torch.Tensor:
    """Per-token KL estimate ``(B, T)``: the selected estimator (a :class:`rlhf.components.KLEstimator`,
    e.g. ``k1``/``k2``/``k3`` of rlhf-plugin-kl) applied to ℓ = log π − log π_ref in fp32, clamped to [−10, 10]."""
    log_ratio = as_float(log_probs) - as_float(ref_log_probs)
    return estimator(log_ratio).clamp(-10.0, 10.0)


def kl_with_unbiased_gradient(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, old_log_probs: torch.Tensor,
                              estimator: KLEstimator) -> torch.Tensor:
    """``--algo.kl.unbiased_gradient``: the chosen estimator's value in the forward pass, and in the
    backward the gradient of w·ℓ²/2 with w = clip(π/π_old, max=10) detached — the importance-weighted
    true reverse-KL gradient E_old[w·ℓ·∇log π]."""
    import torch

    value = compute_approx_kl(log_probs, ref_log_probs, estimator)
    log_ratio = as_float(log_probs) - as_float(ref_log_probs)
    weight = torch.exp(as_float(log_probs) - as_float(old_log_probs)).clamp(max=10.0).detach()
    surrogate = weight * log_ratio**2 / 2.0
    return value.detach() + surrogate - surrogate.detach()


def aggregate_loss(
    loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    num_tokens: float | None = None,
    num_sequences: float | None = None,
    scale: float = 1.0,
) -> torch.Tensor:
    """Reduce a per-token loss ``(B, T)`` to a scalar (``--actor.loss_agg_mode``).

    token-mean: Σ m·ℓ / N_tok; seq-mean-token-mean: Σ_i [n_i>0]·(Σ_t m·ℓ)/(n_i + 1e-8) / N_seq,
    where N_seq counts only sequences with n_i > 0 (an empty response adds to neither sum).
    ``num_tokens`` / ``num_sequences`` are the normalisers of the whole optimizer step (every
    accumulation micro-batch on every rank); without them the local counts are used.
    ``scale`` multiplies the result (the runtime passes accumulation × data-parallel size to
    cancel DeepSpeed's own averaging, so each optimizer step is one exact mean).
    """
    mask = as_float(mask)
    loss = as_float(loss)
    if mode == "token-mean":
        denominator = num_tokens if num_tokens is not None else mask.sum().clamp(min=1.0)
        return (loss * mask).sum() / denominator * scale
    if mode == "seq-mean-token-mean":
        lengths = mask.sum(dim=1)
        nonempty = (lengths > 0).to(lengths.dtype)
        per_sequence = (loss * mask).sum(dim=1) / (lengths + 1e-8) * nonempty
        denominator = num_sequences if num_sequences is not None else nonempty.sum().clamp(min=1.0)
        return per_sequence.sum() / denominator * scale
    raise ValueError(f"--actor.loss_agg_mode {mode!r}: expected token-mean or seq-mean-token-mean")


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of each (already temperature-scaled) next-token distribution: ``(..., V) -> (...)``.

    It holds several fp32 copies of ``logits``; for a model's logits use :func:`chunked_logprobs`."""
    import torch

    logits = as_float(logits)
    log_p = torch.log_softmax(logits, dim=-1)
    return -(log_p.exp() * log_p).sum(dim=-1)


#: Positions per chunk of :func:`chunked_logprobs`. Its working set beside the logits and their gradient is
#: 2 × LOGPROB_CHUNK_TOKENS × V × 4 B: the chunk's fp32 rows and one temporary of their size (logsumexp's in
#: the forward, the probabilities in the backward; the chunk's copy in the logits' dtype never outlives them),
#: 0.3 GB at a 152k vocabulary. 256, not more: at 1024 it would be 1.2 GB, as much as the fp32 logits of a
#: 4 × 512-token micro-batch themselves (benchmarks/logprob_memory.py measures both); and 256 rows of a
#: 32k-152k vocabulary (8-39 M elements) still keep each kernel of a chunk long beside the Python loop's
#: few microseconds on a GPU.
LOGPROB_CHUNK_TOKENS = 256


def chunked_logprobs(logits: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor, targets: torch.Tensor, *,
                     mask: torch.Tensor | None = None, temperature: float = 1.0, with_entropy: bool = False,
                     chunk_tokens: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs of ``targets`` (and the entropies) under ``softmax(logits[rows, positions] / temperature)``,
    computed ``chunk_tokens`` positions at a time: never a ``(positions, V)`` fp32 tensor.

    ``logits``: ``(R, L, V)``, the model's output in its own dtype (bf16 stays bf16). ``rows``,
    ``positions``, ``targets``: long tensors that broadcast to one shape ``S`` (e.g. ``(B, 1)``,
    ``(B, T)``, ``(B, T)``): the distribution at ``logits[rows, positions]`` is read at ``targets``.
    ``mask`` (``S``, any dtype): where it is 0 nothing is computed, and both results are 0 there.
    Returns ``(log_probs, entropy)``, fp32 (fp64 for fp64 logits) of shape ``S`` on the logits' device;
    ``entropy`` is None unless ``with_entropy``. Differentiable (once) with respect to ``logits``: the backward writes the
    gradient straight into a logits-shaped tensor in the logits' dtype, recomputing each chunk's softmax.
    Besides the logits and their gradient the memory is the ``S``-sized results and about three fp32
    ``(chunk_tokens, V)`` tensors; ``chunk_tokens`` defaults to :data:`LOGPROB_CHUNK_TOKENS`.
    """
    import torch

    rows, positions, targets = torch.broadcast_tensors(rows, positions, targets)
    flat = rows * logits.shape[1] + positions
    keep = None if mask is None else torch.broadcast_to(mask, flat.shape) != 0
    index, wanted = (flat.reshape(-1), targets.reshape(-1)) if keep is None else (flat[keep], targets[keep])
    out = chunked_log_softmax().apply(logits, index, wanted, float(temperature), with_entropy,
                                  chunk_tokens or LOGPROB_CHUNK_TOKENS)
    results = out if with_entropy else (out,)

    def placed(values: torch.Tensor) -> torch.Tensor:
        if keep is None:
            return values.view(flat.shape)
        return values.new_zeros(flat.shape).masked_scatter(keep, values)

    log_probs, *entropy = (placed(values) for values in results)
    return log_probs, entropy[0] if entropy else None
