"""Conformance kits of :class:`rlhf.components.PolicyLoss` and :class:`rlhf.components.KLEstimator`
(docs/plugins/policy-loss.md, docs/plugins/kl-estimator.md)."""

from __future__ import annotations

from typing import Any

from rlhf.registry import ComponentKind
from rlhf.testing.conformance import tensors as tt
from rlhf.testing.conformance._core import (
    ComponentKit,
    ContractProperties,
    check_picklable,
    fail,
    first_failure,
    not_collected,
    show,
)

LOSS = ComponentKind.POLICY_LOSS.label
KL = ComponentKind.KL_ESTIMATOR.label


def _loss_inputs(batch: int, width: int, seed: int, *, with_empty: bool = True, spread: float = 0.3,
                 equal_advantages: bool = False) -> dict[str, Any]:
    """Log-probs ≤ 0 with a log-ratio of about ``spread``, advantages, a right-padded mask."""
    mask = tt.right_padded_mask(tt.random_lengths(batch, width, seed, with_empty=with_empty), width)
    old = -tt.randn(batch, width, seed=seed + 1).abs() * mask
    log_probs = (old + tt.randn(batch, width, seed=seed + 2, scale=spread)) * mask
    advantages = (tt.randn(batch, width, seed=seed + 3) if not equal_advantages else old * 0) * mask
    return {"log_probs": log_probs, "old_log_probs": old, "advantages": advantages, "action_mask": mask}


def _call_loss(loss_fn: Any, inputs: dict[str, Any], dtype: Any = None) -> tuple[Any, Any, Any]:
    """(per-token loss, metrics, d loss.sum() / d log_probs)."""
    import torch

    log_probs = inputs["log_probs"].to(dtype or inputs["log_probs"].dtype).detach().requires_grad_()
    rest = [inputs[k].to(dtype) if dtype is not None else inputs[k] for k in ("old_log_probs", "advantages")]
    out = loss_fn(log_probs, *rest, inputs["action_mask"])
    if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], dict)):
        raise fail(LOSS, "returns (loss, metrics)", f"returned {type(out).__name__}, expected a (tensor, dict) pair")
    loss, metrics = out
    (grad,) = torch.autograd.grad(loss.sum(), log_probs, allow_unused=True)
    return loss, metrics, torch.zeros_like(log_probs) if grad is None else grad


def _loss_problem(loss: Any, metrics: dict[str, Any], grad: Any, inputs: dict[str, Any], dtype: Any) -> str | None:
    """Shape, dtype, finiteness, zero on padding, no gradient through padding, scalar finite metrics."""
    import torch

    mask = inputs["action_mask"]
    if tuple(loss.shape) != tuple(mask.shape):
        return f"loss has shape {tuple(loss.shape)}, expected the per-token {tuple(mask.shape)}"
    if loss.dtype != tt.at_least_fp32(dtype):
        return f"loss is {loss.dtype} for {dtype} inputs, expected {tt.at_least_fp32(dtype)}"
    if not torch.isfinite(loss).all():
        return f"loss is not finite: {tt.describe(loss=loss.detach())}"
    if not torch.isfinite(grad).all():
        return f"the gradient is not finite: {tt.describe(grad=grad)}"
    if (loss.detach() * (1 - mask)).abs().max() > 0:
        return f"loss is non-zero on padding tokens (mask 0): {tt.describe(loss=loss.detach())}"
    if (grad * (1 - mask)).abs().max() > 0:
        return f"gradient flows into padding tokens (mask 0): {tt.describe(grad=grad)}"
    for name, value in metrics.items():
        if not hasattr(value, "numel") or value.numel() != 1 or not torch.isfinite(value).all():
            return f"metric {name!r} is not one finite scalar tensor: {tt.describe(value=value)}"
    return None


def check_loss_traits(loss_fn: Any) -> None:
    if not isinstance(getattr(loss_fn, "token_level", None), bool):
        raise fail(LOSS, "declares its traits", f"token_level must be a bool, got {getattr(loss_fn, 'token_level', None)!r}")


def check_loss_outputs(loss_fn: Any) -> None:
    """Random batches (an empty response included), fp32 and bf16, all-equal groups and extreme log-ratios."""
    import torch

    def case(label: str, inputs: dict[str, Any], dtype: Any) -> Any:
        def check() -> str | None:
            loss, metrics, grad = _call_loss(loss_fn, inputs, dtype)
            return _loss_problem(loss, metrics, grad, inputs, dtype)

        return f"{label} ({str(dtype).replace('torch.', '')}), " + tt.describe(**inputs), check

    cases = []
    for p, n, width in tt.SIZES:
        batch, seed = p * n, p * 100 + width
        cases.append(case("all-equal groups (advantages 0)", _loss_inputs(batch, width, seed, equal_advantages=True, spread=0.0),
                          torch.float32))
        cases.append(case("random batch", _loss_inputs(batch, width, seed), torch.float32))
        cases.append(case("extreme log-ratios", _loss_inputs(batch, width, seed, spread=40.0), torch.float32))
        cases.append(case("random batch", _loss_inputs(batch, width, seed), torch.bfloat16))
    first_failure(LOSS, "loss shape/dtype/finite/padding", cases)


def check_loss_mask_respected(loss_fn: Any) -> None:
    """Values on padding positions must not change the loss of real tokens."""
    import torch

    def case(batch: int, width: int, seed: int) -> Any:
        inputs = _loss_inputs(batch, width, seed)
        mask = inputs["action_mask"]
        noisy = dict(inputs, log_probs=tt.garbage_where_masked(inputs["log_probs"], mask, seed, scale=5.0),
                     old_log_probs=tt.garbage_where_masked(inputs["old_log_probs"], mask, seed + 1, scale=5.0),
                     advantages=tt.garbage_where_masked(inputs["advantages"], mask, seed + 2, scale=5.0))

        def check() -> str | None:
            clean = _call_loss(loss_fn, inputs)[0].detach() * mask
            dirty = _call_loss(loss_fn, noisy)[0].detach() * mask
            if not torch.allclose(clean, dirty, atol=1e-5):
                return f"the loss of real tokens changes with padding values ({tt.describe(clean=clean, with_noise=dirty)})"
            return None

        return tt.describe(**noisy), check

    first_failure(LOSS, "mask respected", [case(p * n, width, p + width) for p, n, width in tt.SIZES])


def check_loss_deterministic(loss_fn: Any) -> None:
    import torch

    inputs = _loss_inputs(6, 5, 3)
    first, second = _call_loss(loss_fn, inputs)[0], _call_loss(loss_fn, inputs)[0]
    if not torch.equal(first, second):
        raise fail(LOSS, "deterministic", "two calls on the same inputs differ", tt.describe(**inputs))


def check_policy_loss(loss_fn: Any) -> None:
    """Every property of the policy-loss contract; raises :class:`ConformanceFailure` on the first broken one."""
    check_loss_traits(loss_fn)
    check_loss_outputs(loss_fn)
    check_loss_mask_respected(loss_fn)
    check_loss_deterministic(loss_fn)
    check_loss_outputs(check_picklable(LOSS, loss_fn))


class PolicyLossKit(ComponentKit):
    """pytest kit: ``class TestMine(PolicyLossKit): component = MyLoss; plugin_module = …; registered_name = …``."""

    kind = ComponentKind.POLICY_LOSS

    def test_traits(self) -> None:
        check_loss_traits(self.make_component())

    def test_outputs(self) -> None:
        check_loss_outputs(self.make_component())

    def test_mask_respected(self) -> None:
        check_loss_mask_respected(self.make_component())

    def test_deterministic(self) -> None:
        check_loss_deterministic(self.make_component())


# ------------------------------------------------------------------ KL estimators


def check_kl_estimator(estimator: Any) -> None:
    """Shape and dtype kept, 0 at log-ratio 0, elementwise, finite values and gradients up to |ℓ| = 50, deterministic."""
    import torch

    def case(label: str, log_ratio: Any) -> Any:
        def check() -> str | None:
            ratio = log_ratio.detach().requires_grad_()
            out = estimator(ratio)
            if tuple(out.shape) != tuple(log_ratio.shape):
                return f"returned shape {tuple(out.shape)}, expected {tuple(log_ratio.shape)}"
            if out.dtype != log_ratio.dtype:
                return f"returned {out.dtype} for a {log_ratio.dtype} log-ratio"
            if not torch.isfinite(out).all():
                return f"returned non-finite values {tt.describe(kl=out.detach())}"
            (grad,) = torch.autograd.grad(out.clamp(-10.0, 10.0).sum(), ratio, allow_unused=True)
            if grad is not None and not torch.isfinite(grad).all():
                return f"the gradient is not finite: {tt.describe(grad=grad)}"
            zero = estimator(torch.zeros_like(log_ratio))
            if zero.abs().max() > 1e-6:
                return f"is not 0 where the policies agree (log-ratio 0): {tt.describe(kl=zero)}"
            if not torch.equal(estimator(log_ratio.clone()), out.detach()):
                return "two calls on the same log-ratio differ (not deterministic)"
            return None

        return f"{label}, log_ratio={show(log_ratio)}", check

    def elementwise(log_ratio: Any) -> Any:
        def check() -> str | None:
            out = estimator(log_ratio)
            for position in (0, -1):
                changed = log_ratio.clone()
                changed[..., position] += 1.0
                moved = estimator(changed) - out
                moved[..., position] = 0.0
                if moved.abs().max() > 0:
                    return f"changing token {position % log_ratio.shape[-1]}'s log-ratio changed other tokens' KL (must be elementwise)"
            return None

        return f"log_ratio={show(log_ratio)}", check

    cases = []
    for p, n, width in tt.SIZES:
        cases.append(case("random", tt.randn(p * n, width, seed=width, scale=0.5)))
        cases.append(case("extreme", tt.randn(p * n, width, seed=width + 1).sign() * 50.0))
    first_failure(KL, "values/dtype/finite/zero at equal policies", cases)
    first_failure(KL, "elementwise", [elementwise(tt.randn(p * n, width, seed=width + 2)) for p, n, width in tt.SIZES if width > 1])
    check_picklable(KL, estimator)


class KLEstimatorKit(ContractProperties, ComponentKit):
    """pytest kit: ``class TestMine(KLEstimatorKit): component = MyKL; plugin_module = …; registered_name = …``."""

    kind = ComponentKind.KL_ESTIMATOR
    contract_properties = ("values/dtype/finite/zero at equal policies", "elementwise", "picklable for Ray",)

    @not_collected
    def test_contract(self) -> None:
        check_kl_estimator(self.make_component())
