"""rlhf.ops.chunked_logprobs against the direct log_softmax formulas, and its memory bound.

Chunks of 4 positions over ~15 selected ones, so several chunks run in both the forward and the backward.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlhf.ops import chunked_logprobs

ROWS, LENGTH, VOCAB, ACTIONS, CHUNK = 3, 9, 50, 7, 4


def random_case(seed: int, dtype: torch.dtype):
    gen = torch.Generator().manual_seed(seed)
    logits = (torch.randn(ROWS, LENGTH, VOCAB, generator=gen) * 3).to(dtype)
    positions = torch.randint(0, LENGTH, (ROWS, ACTIONS), generator=gen)  # repeats too: their gradients add up
    targets = torch.randint(0, VOCAB, (ROWS, ACTIONS), generator=gen)
    mask = (torch.rand(ROWS, ACTIONS, generator=gen) > 0.3).float()
    weights = torch.randn(2, ROWS, ACTIONS, generator=gen)
    return logits, torch.arange(ROWS)[:, None], positions, targets, mask, weights


def direct(logits, rows, positions, targets, mask, temperature, compute_dtype):
    """The formulas written out on the full (B, T, V) tensor: log_softmax, gather, −Σ p log p."""
    scaled = logits[rows, positions].to(compute_dtype) / temperature
    log_p = torch.log_softmax(scaled, -1)
    logp = log_p.gather(-1, targets[..., None]).squeeze(-1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    return logp * mask, entropy * mask


def values_and_gradient(compute, logits, weights):
    """(log-probs, entropies, d(w₁·logp + w₂·H)/d logits) of one way to compute them."""
    logits = logits.detach().requires_grad_()
    logp, entropy = compute(logits)
    (weights[0] * logp + weights[1] * entropy).sum().backward()
    return logp.detach(), entropy.detach(), logits.grad


# fp64: the maths exactly; fp32: the chunked path against today's fp32 one to 1e-6; bf16 logits: fp32 values
# as before, the bf16 gradient within one bf16 rounding of the one the direct path rounds to bf16
@pytest.mark.parametrize(("dtype", "compute_dtype", "grad_tol"), [
    (torch.float64, torch.float64, 1e-12), (torch.float32, torch.float32, 1e-6), (torch.bfloat16, torch.float32, 8e-3)])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("seed", range(2))
def test_logprobs_entropy_and_gradients_match_the_direct_formulas(dtype, compute_dtype, grad_tol, temperature, seed) -> None:
    logits, rows, positions, targets, mask, weights = random_case(seed, dtype)
    got = values_and_gradient(lambda x: chunked_logprobs(x, rows, positions, targets, mask=mask, temperature=temperature,
                                                         with_entropy=True, chunk_tokens=CHUNK), logits, weights)
    want = values_and_gradient(lambda x: direct(x, rows, positions, targets, mask, temperature, compute_dtype),
                               logits, weights)
    value_tol = 1e-12 if dtype == torch.float64 else 1e-6
    for name, a, b in zip(("log-probs", "entropy"), got, want):
        assert a.dtype == compute_dtype, name
        torch.testing.assert_close(a, b, atol=value_tol, rtol=value_tol, msg=name)
    assert got[2].dtype == dtype
    torch.testing.assert_close(got[2].double(), want[2].double(), atol=value_tol, rtol=grad_tol)
    assert got[2].abs().sum() > 0 and bool((got[0] == 0).eq(mask == 0).all())  # masked places: exactly 0


def test_without_entropy_the_log_probs_and_their_gradient_are_the_same() -> None:
    logits, rows, positions, targets, mask, weights = random_case(7, torch.float32)
    with_h = values_and_gradient(lambda x: chunked_logprobs(x, rows, positions, targets, mask=mask, with_entropy=True,
                                                            chunk_tokens=CHUNK), logits, weights * torch.tensor([1.0, 0.0])[:, None, None])
    logits = logits.requires_grad_()
    logp, entropy = chunked_logprobs(logits, rows, positions, targets, mask=mask, chunk_tokens=CHUNK)
    (weights[0] * logp).sum().backward()
    assert entropy is None
    torch.testing.assert_close(logp.detach(), with_h[0], atol=0, rtol=0)
    torch.testing.assert_close(logits.grad, with_h[2], atol=1e-7, rtol=1e-6)


def test_masked_positions_get_no_gradient() -> None:
    logits, rows, positions, targets, _, weights = random_case(3, torch.float32)
    mask = torch.zeros(ROWS, ACTIONS)
    mask[0, :2] = 1.0  # two positions of row 0 only
    _, _, grad = values_and_gradient(lambda x: chunked_logprobs(x, rows, positions, targets, mask=mask, with_entropy=True,
                                                                chunk_tokens=CHUNK), logits, weights)
    touched = torch.zeros(ROWS, LENGTH, dtype=torch.bool)
    touched[0, positions[0, :2]] = True
    assert grad[touched].abs().sum() > 0 and not grad[~touched].any()


class LargestFloatTensor(TorchDispatchMode):
    """Records the most elements of any fp32/fp64 tensor an op returns (forward and backward: allocations)."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor) and tensor.dtype in (torch.float32, torch.float64):
                self.largest = max(self.largest, tensor.numel())
        return out


@pytest.mark.parametrize("chunked", [True, False])
def test_no_fp32_tensor_bigger_than_one_chunk_of_the_vocabulary(chunked: bool) -> None:
    """bf16 logits, as a model returns them: only one chunk of rows is ever fp32, in the forward and the
    backward. The same probe on the direct formulas sees their (B, T, V) fp32 tensors, so it can fail."""
    logits, rows, positions, targets, _, weights = random_case(0, torch.bfloat16)
    mask = torch.ones(ROWS, ACTIONS)

    def compute(x):
        if chunked:
            return chunked_logprobs(x, rows, positions, targets, mask=mask, with_entropy=True, chunk_tokens=CHUNK)
        return direct(x, rows, positions, targets, mask, 1.0, torch.float32)

    probe = LargestFloatTensor()
    with probe:
        values_and_gradient(compute, logits, weights)
    if chunked:
        assert probe.largest == CHUNK * VOCAB
    else:
        assert probe.largest == ROWS * ACTIONS * VOCAB
