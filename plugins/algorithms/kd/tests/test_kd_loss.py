"""The KD loss against independent expressions (explicit loops over the vocabulary), on CPU."""

from __future__ import annotations

import math

import pytest
import torch
from rlhf_plugin_kd.losses import distill_terms, match_vocab, mix, token_losses
from rlhf_supervised.batch import collate, per_sample_sum, token_logprobs

from rlhf.config.base import ConfigError

V = 11


def reference(student: torch.Tensor, teacher: torch.Tensor, ids: torch.Tensor, mask: torch.Tensor, alpha: float):
    """Loop per row, per position t (logits at t−1), per vocab entry: ((R, L) nll, (R, L) kd, (R, L) loss)."""
    rows, length = ids.shape
    nll, kd = torch.zeros(rows, length, dtype=torch.float64), torch.zeros(rows, length, dtype=torch.float64)
    for r in range(rows):
        for t in range(1, length):
            if mask[r, t] == 0:
                continue
            s = [float(x) for x in student[r, t - 1]]
            q = [float(x) for x in teacher[r, t - 1]]
            z_s = sum(math.exp(x) for x in s if x != -math.inf)
            z_q = sum(math.exp(x) for x in q if x != -math.inf)
            nll[r, t] = -(s[int(ids[r, t])] - math.log(z_s))
            total = 0.0
            for v in range(len(s)):
                if math.isinf(s[v]):
                    continue  # inf-masked entry
                p = (math.exp(q[v]) / z_q) if q[v] != -math.inf else 0.0
                total += p * (s[v] - math.log(z_s))
            kd[r, t] = -total
    return nll, kd, (1 - alpha) * nll + alpha * kd


def random_case(seed: int, packed: bool):
    gen = torch.Generator().manual_seed(seed)
    lengths = [5, 7, 3]
    seqs = [torch.randint(0, V, (n,), generator=gen).tolist() for n in lengths]
    masks = [[0] * 2 + [1] * (n - 2) for n in lengths]
    batch = collate(seqs, masks, pad_id=0, packed=packed)
    shape = (*batch.input_ids.shape, V)
    student = torch.randn(shape, generator=gen, dtype=torch.float64) * 2
    teacher = torch.randn(shape, generator=gen, dtype=torch.float64) * 2
    return batch, student, teacher


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("alpha", [0.0, 0.4, 1.0])
def test_matches_loop_reference(packed: bool, alpha: float) -> None:
    batch, student, teacher = random_case(0, packed)
    nll, kd = token_losses(student, teacher, batch.input_ids, batch.loss_mask)
    ref_nll, ref_kd, ref_loss = reference(student, teacher, batch.input_ids, batch.loss_mask, alpha)
    torch.testing.assert_close(nll.double(), ref_nll, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(kd.double(), ref_kd, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(mix(nll, kd, alpha).double(), ref_loss, rtol=1e-5, atol=1e-5)
    assert (nll[batch.loss_mask == 0] == 0).all() and (kd[batch.loss_mask == 0] == 0).all()


def test_alpha_extremes_are_nll_and_kd() -> None:
    batch, student, teacher = random_case(1, False)
    nll, kd = token_losses(student, teacher, batch.input_ids, batch.loss_mask)
    # α = 0 is SFT's NLL, as the core reads it
    sft_nll = -(token_logprobs(student, batch) * batch.loss_mask)
    torch.testing.assert_close(mix(nll, kd, 0.0).double(), sft_nll.double(), rtol=1e-6, atol=1e-6)
    # α = 1 is the cross-entropy to the teacher, here through torch.distributions: H(p, q) = H(p) + KL(p ‖ q)
    p = torch.distributions.Categorical(logits=teacher[:, :-1])
    q = torch.distributions.Categorical(logits=student[:, :-1])
    cross = torch.nn.functional.pad(p.entropy() + torch.distributions.kl_divergence(p, q), (1, 0)) * batch.loss_mask
    torch.testing.assert_close(mix(nll, kd, 1.0).double(), cross, rtol=1e-6, atol=1e-6)


def test_teacher_equal_to_student_gives_entropy() -> None:
    batch, student, _ = random_case(2, True)
    _, kd = token_losses(student, student, batch.input_ids, batch.loss_mask)
    entropy = torch.nn.functional.pad(torch.distributions.Categorical(logits=student[:, :-1]).entropy(), (1, 0))
    torch.testing.assert_close(kd.double(), entropy * batch.loss_mask, rtol=1e-6, atol=1e-6)


def test_inf_student_logits_are_masked_not_nan() -> None:
    batch, student, teacher = random_case(3, False)
    student = student.clone()
    student[..., 4] = -math.inf  # a banned token everywhere
    student[0, 2, 7] = -math.inf
    teacher = teacher.clone()
    teacher[1, 3, 5] = -math.inf  # teacher probability 0 somewhere
    ids = batch.input_ids.masked_fill(batch.input_ids == 4, 3)  # targets keep a finite student logit
    student.requires_grad_(True)
    nll, kd = token_losses(student, teacher, ids, batch.loss_mask)
    assert torch.isfinite(nll).all() and torch.isfinite(kd).all()
    ref_nll, ref_kd, _ = reference(student.detach(), teacher, ids, batch.loss_mask, 0.5)
    torch.testing.assert_close(kd.double(), ref_kd, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(nll.double(), ref_nll, rtol=1e-5, atol=1e-5)
    mix(nll, kd, 0.5).sum().backward()
    assert torch.isfinite(student.grad).all()
    assert (student.grad[..., 4] == 0).all()


def test_gradient_is_student_softmax_minus_teacher() -> None:
    """d kd_t / d s = softmax(s) − softmax(q) at the predicting position; the teacher gets no gradient."""
    gen = torch.Generator().manual_seed(4)
    s = torch.randn(6, V, generator=gen, dtype=torch.float64, requires_grad=True)
    q = torch.randn(6, V, generator=gen, dtype=torch.float64, requires_grad=True)
    _, kd = distill_terms(s, q, torch.zeros(6, dtype=torch.long))
    kd.sum().backward()
    torch.testing.assert_close(s.grad, torch.softmax(s.detach(), -1) - torch.softmax(q.detach(), -1))
    assert q.grad is None


def test_per_sample_sums_packed_equal_padded() -> None:
    padded, student, teacher = random_case(5, False)
    packed, _, _ = random_case(5, True)
    nll, kd = token_losses(student, teacher, padded.input_ids, padded.loss_mask)
    # the same logits, laid out as one packed row
    keep = padded.sample_ids >= 0
    flat_s, flat_t = student[keep].unsqueeze(0), teacher[keep].unsqueeze(0)
    nll_p, kd_p = token_losses(flat_s, flat_t, packed.input_ids, packed.loss_mask)
    torch.testing.assert_close(per_sample_sum(kd, padded), per_sample_sum(kd_p, packed))
    torch.testing.assert_close(per_sample_sum(nll, padded), per_sample_sum(nll_p, packed))


def test_vocab_sizes() -> None:
    logits = torch.randn(3, 8)
    assert match_vocab(logits, 8, None) is logits
    sliced = match_vocab(logits, 6, tokenizer_size=5)  # teacher embedding padded past the tokenizer
    assert torch.equal(sliced, logits[:, :6])
    padded = match_vocab(logits, 10, tokenizer_size=8)  # student embedding padded: zero teacher mass there
    assert padded.shape == (3, 10) and torch.softmax(padded, -1)[:, 8:].eq(0).all()
    with pytest.raises(ConfigError, match="share the tokenizer"):
        match_vocab(logits, 6, tokenizer_size=7)
    with pytest.raises(ConfigError, match="8 tokens but the student's has 6"):
        match_vocab(logits, 6, None)
