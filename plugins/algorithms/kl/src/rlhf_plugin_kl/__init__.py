"""The KL estimators of Schulman's "Approximating KL divergence" note, per token.

With ℓ = log π − log π_ref (the core passes it in fp32, clamps the result to [−10, 10]
and masks it):

    k1 = ℓ                      unbiased for KL(π‖π_ref) under samples of π; can be negative
    k2 = ℓ² / 2                 low variance, biased
    k3 = e^(−ℓ) − 1 + ℓ         unbiased and non-negative; ℓ is clamped at ≥ −10 before the exp

Selected with ``--algo.kl.estimator k1|k2|k3``. The estimators use tensor methods only,
so this module imports nothing heavy.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


class K1:
    """k1 = ℓ."""

    def __call__(self, log_ratio):
        return log_ratio


class K2:
    """k2 = ℓ²/2."""

    def __call__(self, log_ratio):
        return log_ratio**2 / 2.0


class K3:
    """k3 = e^(−ℓ) − 1 + ℓ, with ℓ clamped at ≥ −10 so e^(−ℓ) stays finite."""

    def __call__(self, log_ratio):
        log_ratio = log_ratio.clamp(min=-10.0)
        return (-log_ratio).exp() - 1.0 + log_ratio


@rlhf.hookimpl
def rlhf_register_kl_estimators(register):
    register("k1", K1, description="log-ratio (unbiased, can be negative)")
    register("k2", K2, description="squared log-ratio / 2 (low variance)")
    register("k3", K3, description="exp(-r) - 1 + r (unbiased, non-negative)")
