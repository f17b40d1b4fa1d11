"""k1, k2, k3 against their formulas, and through the KL-estimator conformance kit."""

from __future__ import annotations

import math

import pytest
import torch
from rlhf_plugin_kl import K1, K2, K3

from rlhf.ops import compute_approx_kl
from rlhf.testing.conformance import KLEstimatorKit

FORMULAS = {
    K1: lambda ell: ell,
    K2: lambda ell: ell * ell / 2,
    K3: lambda ell: math.exp(-max(ell, -10.0)) - 1 + max(ell, -10.0),
}


@pytest.mark.parametrize("estimator", [K1, K2, K3], ids=["k1", "k2", "k3"])
@pytest.mark.parametrize("seed", range(3))
def test_matches_its_formula_with_the_cores_clamp(estimator: type, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    logp, ref = torch.randn(3, 5, generator=gen) * 8, torch.randn(3, 5, generator=gen) * 8  # extreme ratios included
    got = compute_approx_kl(logp, ref, estimator())
    for value, ell in zip(got.flatten().tolist(), (logp - ref).flatten().tolist()):
        assert value == pytest.approx(min(max(FORMULAS[estimator](ell), -10.0), 10.0), rel=1e-5, abs=1e-5)


class TestK1(KLEstimatorKit):
    component, plugin_module, registered_name = K1, "rlhf_plugin_kl", "k1"


class TestK2(KLEstimatorKit):
    component, plugin_module, registered_name = K2, "rlhf_plugin_kl", "k2"


class TestK3(KLEstimatorKit):
    component, plugin_module, registered_name = K3, "rlhf_plugin_kl", "k3"
