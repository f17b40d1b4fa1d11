"""KL estimators, the unbiased KL gradient, loss aggregation, entropy and the rollout correction's place in the
objective vs their formulas."""

from __future__ import annotations

import math

import pytest
import torch
from rlhf_plugin_kl import K1, K2, K3
from rlhf_plugin_ppo.loss import PPOClipLoss
from rlhf_plugin_rollout_correction.importance import ImportanceSampling

from rlhf.ops import aggregate_loss, compute_approx_kl, kl_with_unbiased_gradient, token_entropy
from rlhf.runtime.workers.objective import ObjectiveSettings, StepNormalisers, policy_objective

KL_ESTIMATORS = {"k1": K1(), "k2": K2(), "k3": K3()}


def random_mask(batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    lengths = torch.randint(0, length + 1, (batch,), generator=gen)
    lengths[0] = 0  # always include an empty sequence
    return (torch.arange(length)[None, :] < lengths[:, None]).float()


@pytest.mark.parametrize("seed", range(4))
def test_kl_estimators_match_their_formulas_with_clamps(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    logp = torch.randn(4, 6, generator=gen) * 8  # extreme log-ratios included
    ref = torch.randn(4, 6, generator=gen) * 8
    for estimator in ("k1", "k2", "k3"):
        got = compute_approx_kl(logp.to(torch.bfloat16), ref.to(torch.bfloat16), KL_ESTIMATORS[estimator])
        lp, rf = logp.to(torch.bfloat16).double(), ref.to(torch.bfloat16).double()
        for value, a, b in zip(got.flatten().tolist(), lp.flatten().tolist(), rf.flatten().tolist()):
            ell = a - b
            expected = {"k1": ell, "k2": ell * ell / 2,
                        "k3": math.exp(-max(ell, -10.0)) - 1 + max(ell, -10.0)}[estimator]
            assert value == pytest.approx(min(max(expected, -10.0), 10.0), rel=1e-5, abs=1e-5)


def test_unbiased_kl_keeps_the_value_and_uses_the_is_weighted_reverse_kl_gradient() -> None:
    gen = torch.Generator().manual_seed(0)
    logp = torch.randn(3, 5, generator=gen).requires_grad_()
    ref, old = torch.randn(3, 5, generator=gen), torch.randn(3, 5, generator=gen)
    value = kl_with_unbiased_gradient(logp, ref, old, K3())
    torch.testing.assert_close(value.detach(), compute_approx_kl(logp.detach(), ref, K3()))
    value.sum().backward()
    weight = torch.exp(logp.detach() - old).clamp(max=10.0)
    torch.testing.assert_close(logp.grad, weight * (logp.detach() - ref))


@pytest.mark.parametrize("seed", range(4))
def test_aggregation_modes(seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    loss, mask = torch.randn(5, 7, generator=gen), random_mask(5, 7, gen)
    token_mean = aggregate_loss(loss, mask, "token-mean")
    assert token_mean.item() == pytest.approx(((loss * mask).sum() / mask.sum()).item(), rel=1e-6)
    per_seq = [(loss[i] * mask[i]).sum() / (mask[i].sum() + 1e-8) if mask[i].sum() > 0 else torch.tensor(0.0) for i in range(5)]
    nonempty = int((mask.sum(dim=1) > 0).sum())  # an empty response is not a sequence of the mean
    seq_mean = aggregate_loss(loss, mask, "seq-mean-token-mean")
    assert seq_mean.item() == pytest.approx((sum(per_seq) / max(nonempty, 1)).item(), rel=1e-6, abs=1e-7)
    # global normalisers and the DeepSpeed scale
    scaled = aggregate_loss(loss, mask, "token-mean", num_tokens=100.0, scale=4.0)
    assert scaled.item() == pytest.approx(((loss * mask).sum() / 100.0 * 4.0).item(), rel=1e-6)
    assert aggregate_loss(loss, mask, "seq-mean-token-mean", num_sequences=20.0).item() == pytest.approx(
        (sum(per_seq) / 20.0).item(), rel=1e-6, abs=1e-7)


def test_split_micro_batches_with_global_normaliser_equal_one_token_mean() -> None:
    gen = torch.Generator().manual_seed(1)
    loss, mask = torch.randn(8, 6, generator=gen), random_mask(8, 6, gen)
    total_tokens = mask.sum().item()
    parts = sum(aggregate_loss(loss[i:i + 2], mask[i:i + 2], "token-mean", num_tokens=total_tokens) for i in range(0, 8, 2))
    assert parts.item() == pytest.approx(aggregate_loss(loss, mask, "token-mean").item(), rel=1e-6)


def test_entropy() -> None:
    logits = torch.randn(2, 3, 11)
    p = torch.softmax(logits.double(), -1)
    torch.testing.assert_close(token_entropy(logits).double(), -(p * p.log()).sum(-1), atol=1e-5, rtol=1e-5)


def test_the_objective_multiplies_a_token_level_loss_by_the_active_correction() -> None:
    gen = torch.Generator().manual_seed(0)
    mask = random_mask(4, 6, gen)
    rollout = -torch.rand(4, 6, generator=gen) * 3
    old = rollout + torch.randn(4, 6, generator=gen) * 0.7
    logp, advantages = old + torch.randn(4, 6, generator=gen) * 0.1, torch.randn(4, 6, generator=gen)
    correction = ImportanceSampling("token", "clip")
    normalisers = StepNormalisers(float(mask.sum()), 3.0)
    loss, metrics = policy_objective(PPOClipLoss(), ObjectiveSettings(correction=correction), normalisers, logp, old, advantages,
                                     mask, rollout_log_probs=rollout)
    plain, _ = PPOClipLoss()(logp, old, advantages, mask)
    coefficient, _ = correction(old, rollout, mask)
    assert loss.item() == pytest.approx(float((plain * coefficient * mask).sum() / mask.sum()), rel=1e-5)
    assert {"vllm_kl", "is_filter_ratio"} <= set(metrics)
