"""The KTO loss against the paper's formula, written out independently per sample with ``math``."""

from __future__ import annotations

import math

import pytest
import torch
from rlhf_plugin_kto.losses import kl_estimate, kto_loss


def reference(policy, ref, kl, desirable, beta, w_d, w_u):
    """Per sample, in plain floats: w·(1 − sigmoid(±β(r − max(KL, 0))))."""
    z = max(kl, 0.0)
    out = []
    for p, q, good in zip(policy, ref, desirable):
        r = p - q
        x = beta * (r - z) if good else beta * (z - r)
        out.append((w_d if good else w_u) * (1.0 - 1.0 / (1.0 + math.exp(-x))))
    return out


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("kind", ["mixed", "all_desirable", "all_undesirable"])
def test_matches_formula(seed, kind):
    gen = torch.Generator().manual_seed(seed)
    n = 7
    policy = -torch.rand(n, generator=gen, dtype=torch.float64) * 40
    ref = -torch.rand(n, generator=gen, dtype=torch.float64) * 40
    desirable = {"mixed": torch.rand(n, generator=gen) < 0.5, "all_desirable": torch.ones(n, dtype=torch.bool),
                 "all_undesirable": torch.zeros(n, dtype=torch.bool)}[kind]
    kl = torch.tensor(float(torch.rand((), generator=gen)) * 3)
    beta, w_d, w_u = 0.1 + seed * 0.05, 1.0 + seed * 0.3, 1.33
    got = kto_loss(policy, ref, kl, desirable, beta, w_d, w_u)
    want = reference(policy.tolist(), ref.tolist(), float(kl), desirable.tolist(), beta, w_d, w_u)
    assert got.shape == (n,)
    assert got.tolist() == pytest.approx(want, rel=1e-5, abs=1e-6)


def test_negative_kl_is_clamped_to_zero():
    policy, ref = torch.tensor([-3.0, -5.0, -1.0]), torch.tensor([-4.0, -4.0, -2.0])
    desirable = torch.tensor([True, False, True])
    negative = kto_loss(policy, ref, torch.tensor(-2.5), desirable, 0.5)
    zero = kto_loss(policy, ref, torch.tensor(0.0), desirable, 0.5)
    assert torch.equal(negative, zero)
    assert negative.tolist() == pytest.approx(reference([-3, -5, -1], [-4, -4, -2], 0.0, [1, 0, 1], 0.5, 1, 1))


def test_equal_policy_and_reference_gives_one_half_times_weight():
    logps = torch.randn(6)
    desirable = torch.tensor([True, False] * 3)
    losses = kto_loss(logps, logps.clone(), torch.tensor(0.0), desirable, 0.01, 2.0, 3.0)
    assert losses.tolist() == pytest.approx([1.0, 1.5] * 3)


def test_gradient_flows_to_policy_only_through_matched_logratio():
    policy = torch.tensor([-2.0, -3.0], requires_grad=True)
    kl_source = torch.tensor([-1.0, -1.5], requires_grad=True)
    kl = kl_estimate(kl_source, torch.tensor([-2.0, -2.0]))
    assert not kl.requires_grad and float(kl) == pytest.approx(0.75)
    kto_loss(policy, torch.tensor([-2.5, -2.5]), kl, torch.tensor([True, False]), 1.0).sum().backward()
    # d/dr (1 - σ(β(r - z))) = -β σ'(.) < 0 for desirable; +β σ'(.) > 0 for undesirable
    assert policy.grad[0] < 0 < policy.grad[1]
    assert kl_source.grad is None


def test_kl_estimate_is_the_mean_logratio():
    policy, ref = torch.tensor([-1.0, -2.0, -6.0]), torch.tensor([-2.0, -2.0, -3.0])
    assert float(kl_estimate(policy, ref)) == pytest.approx((1.0 + 0.0 - 3.0) / 3)
