"""Conformance kit of :class:`rlhf.components.AdvantageEstimator` (docs/plugins/advantage-estimator.md)."""

from __future__ import annotations

from typing import Any

from rlhf.registry import ComponentKind
from rlhf.testing.conformance import tensors as tt
from rlhf.testing.conformance._core import ComponentKit, check_picklable, fail, first_failure

KIND = ComponentKind.ADVANTAGE_ESTIMATOR.label
SETTINGS = ((1.0, 1.0), (0.9, 0.95))  # (gamma, lambd)


def _group_size(estimator: Any, n: int) -> int:
    return max(n, int(getattr(estimator, "min_samples_per_prompt", 1)))


def check_traits(estimator: Any) -> None:
    for trait, kind in (("needs_critic", bool), ("min_samples_per_prompt", int), ("whiten", bool),
                        ("forces_unit_gamma", bool)):
        value = getattr(estimator, trait, None)
        if not isinstance(value, kind) or (kind is int and value < 1):
            raise fail(KIND, "declares its traits", f"{trait} must be a {kind.__name__}"
                       f"{' >= 1' if kind is int else ''}, got {value!r}")


def check_group_rewards(estimator: Any) -> None:
    """``(P, n) -> (P, n)``, at least fp32, finite (also on all-equal groups), input untouched, deterministic."""
    import torch

    def case(rewards: Any) -> Any:
        def check() -> str | None:
            before = rewards.clone()
            out = estimator.group_rewards(rewards)
            if not torch.equal(rewards, before):
                return "modified its input in place"
            if tuple(out.shape) != tuple(rewards.shape):
                return f"returned shape {tuple(out.shape)}, expected {tuple(rewards.shape)}"
            if out.dtype != tt.at_least_fp32(rewards.dtype):
                return f"returned {out.dtype} for {rewards.dtype} rewards, expected {tt.at_least_fp32(rewards.dtype)}"
            if not torch.isfinite(out).all():
                return f"returned non-finite values {tt.describe(out=out)}"
            if not torch.equal(out, estimator.group_rewards(rewards.clone())):
                return "two calls on the same rewards differ (not deterministic)"
            return None
        return tt.describe(rewards=rewards), check

    cases = []
    for p, n, _ in tt.SIZES:
        n = _group_size(estimator, n)
        cases.append(case(torch.full((p, n), 0.5)))  # every group all-equal: std 0
        cases.append(case(tt.randn(p, n, seed=p * 10 + n)))
        cases.append(case(tt.randn(p, n, seed=p * 10 + n).to(torch.bfloat16)))
        cases.append(case(tt.randn(p, n, seed=p * 10 + n + 1, scale=1e4)))  # large rewards
    first_failure(KIND, "group_rewards shape/dtype/finite", cases)


def _advantage_inputs(estimator: Any, batch: int, width: int, seed: int, *, with_empty: bool, dtype: Any = None) -> tuple:
    """Per-token rewards and (when the estimator needs a critic) values, zero on padding as the runtime passes them."""
    mask = tt.right_padded_mask(tt.random_lengths(batch, width, seed, with_empty=with_empty), width)
    rewards = tt.randn(batch, width, seed=seed + 1) * mask
    values = tt.randn(batch, width, seed=seed + 2) * mask if estimator.needs_critic else None
    if dtype is not None:
        rewards = rewards.to(dtype)
        values = values.to(dtype) if values is not None else None
    return rewards, mask, values


def check_advantages(estimator: Any) -> None:
    """Both outputs ``(B, T)``, at least fp32, finite, zero on padding and on empty responses, deterministic."""
    import torch

    def case(batch: int, width: int, seed: int, gamma: float, lambd: float, *, with_empty: bool, dtype: Any = None) -> Any:
        rewards, mask, values = _advantage_inputs(estimator, batch, width, seed, with_empty=with_empty, dtype=dtype)

        def check() -> str | None:
            advantages, returns = estimator.advantages(rewards, mask, values, gamma, lambd)
            for name, out in (("advantages", advantages), ("returns", returns)):
                if tuple(out.shape) != (batch, width):
                    return f"{name} have shape {tuple(out.shape)}, expected {(batch, width)}"
                if out.dtype != tt.at_least_fp32(rewards.dtype):
                    return f"{name} are {out.dtype} for {rewards.dtype} inputs, expected {tt.at_least_fp32(rewards.dtype)}"
                if not torch.isfinite(out).all():
                    return f"{name} are not finite: {tt.describe(out=out)}"
                if (out * (1 - mask)).abs().max() > 0:
                    return f"{name} are non-zero on padding tokens (mask 0): {tt.describe(out=out)}"
            again = estimator.advantages(rewards.clone(), mask.clone(), None if values is None else values.clone(), gamma, lambd)
            if not (torch.equal(again[0], advantages) and torch.equal(again[1], returns)):
                return "two calls on the same inputs differ (not deterministic)"
            return None

        return f"B={batch} T={width} gamma={gamma} lambd={lambd}, " + tt.describe(token_rewards=rewards, action_mask=mask,
                                                                               values=values), check

    cases = []
    for p, n, width in tt.SIZES:
        batch = p * _group_size(estimator, n)
        for gamma, lambd in SETTINGS:
            cases.append(case(batch, width, batch + width, gamma, lambd, with_empty=False))
            cases.append(case(batch, width, batch + width, gamma, lambd, with_empty=True))
        cases.append(case(batch, width, batch + width, 1.0, 1.0, with_empty=True, dtype=torch.bfloat16))
    first_failure(KIND, "advantages shape/dtype/finite/padding", cases)


def check_mask_respected(estimator: Any) -> None:
    """What lies on padding positions (mask 0) must not change the advantages or returns of real tokens."""
    import torch

    def case(batch: int, width: int, seed: int) -> Any:
        rewards, mask, values = _advantage_inputs(estimator, batch, width, seed, with_empty=True)
        noisy_rewards = tt.garbage_where_masked(rewards, mask, seed)
        noisy_values = None if values is None else tt.garbage_where_masked(values, mask, seed + 1)

        def check() -> str | None:
            clean = estimator.advantages(rewards, mask, values, 1.0, 1.0)
            noisy = estimator.advantages(noisy_rewards, mask, noisy_values, 1.0, 1.0)
            for name, a, b in (("advantages", clean[0], noisy[0]), ("returns", clean[1], noisy[1])):
                if not torch.allclose(a * mask, b * mask, atol=1e-5):
                    return (f"{name} of real tokens change when padding holds other values "
                            f"({tt.describe(clean=a * mask, with_noise=b * mask)}); multiply inputs by action_mask")
            return None

        return tt.describe(token_rewards=noisy_rewards, action_mask=mask), check

    first_failure(KIND, "mask respected", [case(p * _group_size(estimator, n), width, p + width) for p, n, width in tt.SIZES])


def check_advantage_estimator(estimator: Any) -> None:
    """Every property of the contract, in order; raises :class:`ConformanceFailure` on the first broken one."""
    check_traits(estimator)
    check_group_rewards(estimator)
    check_advantages(estimator)
    check_mask_respected(estimator)
    restored = check_picklable(KIND, estimator)
    check_group_rewards(restored)


class AdvantageEstimatorKit(ComponentKit):
    """pytest kit: ``class TestMine(AdvantageEstimatorKit): component = Mine; plugin_module = "my_pkg"; registered_name = "mine"``."""

    kind = ComponentKind.ADVANTAGE_ESTIMATOR

    def test_traits(self) -> None:
        check_traits(self.make_component())

    def test_group_rewards(self) -> None:
        check_group_rewards(self.make_component())

    def test_advantages(self) -> None:
        check_advantages(self.make_component())

    def test_mask_respected(self) -> None:
        check_mask_respected(self.make_component())
