"""KL estimators, the unbiased KL gradient, loss aggregation, entropy and IS correction vs their formulas."""

from __future__ import annotations

import math

import pytest
import torch
from rlhf_plugin_kl import K1, K2, K3

from rlhf import is_correction
from rlhf.ops import aggregate_loss, compute_approx_kl, kl_with_unbiased_gradient, token_entropy

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


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize(("level", "mode", "gating", "threshold"), [
    ("token", "clip", "ratio", [0.5, 5.0]),        # TIS
    ("token", "mask", "ratio", [0.5, 5.0]),        # ICEPOP
    ("seq", "mask", "ratio", [0.8, 1.25]),         # seq-mask-tis
    ("seq", "mask", "binary_kl", [0.05]),          # FlashREINFORCE trust region
    ("token", "mask", "tv", [0.0, 0.1]),
])
def test_is_correction_matches_the_formulas(seed, level, mode, gating, threshold) -> None:
    gen = torch.Generator().manual_seed(seed)
    rollout = -torch.rand(4, 6, generator=gen) * 3
    old = rollout + torch.randn(4, 6, generator=gen) * 0.7
    mask = random_mask(4, 6, gen)
    coef, metrics = is_correction.correction(old, rollout, mask, level=level, mode=mode, gating=gating, threshold=threshold)
    low, high = (0.0, threshold[0]) if len(threshold) == 1 else threshold
    for i in range(4):
        n = int(mask[i].sum())
        for t in range(6):
            if t >= n:
                assert coef[i, t] == 0
                continue
            w = math.exp(old[i, t] - rollout[i, t])

            def stat_of(tt: int, i: int = i) -> float:
                p = min(max(math.exp(rollout[i, tt]), 1e-6), 1 - 1e-6)
                q = min(max(math.exp(old[i, tt]), 1e-6), 1 - 1e-6)
                if gating == "binary_kl":
                    return p * math.log(p / q) + (1 - p) * math.log((1 - p) / (1 - q))
                return abs(p - q) if gating == "tv" else math.exp(old[i, tt] - rollout[i, tt])

            if level == "seq":
                stat = (math.exp(sum(old[i, k] - rollout[i, k] for k in range(n)) / n) if gating == "ratio"
                        else sum(stat_of(k) for k in range(n)) / n)
            else:
                stat = stat_of(t)
            expected = min(max(stat, low), high) if mode == "clip" else w * float(low <= stat <= high)
            assert coef[i, t].item() == pytest.approx(expected, rel=1e-4, abs=1e-6)
    vllm_kl = ((rollout - old) * mask).sum() / mask.sum().clamp(min=1)  # an all-empty batch gives 0
    assert metrics["vllm_kl"].item() == pytest.approx(vllm_kl.item(), rel=1e-5)
    assert 0.0 <= metrics["is_filter_ratio"].item() <= 1.0


@pytest.mark.parametrize(("args", "message"), [
    (("seq", "clip", "ratio", [0.5, 5.0]), "clip needs --algo.advantage.is_correction_level token"),
    (("token", "clip", "tv", [0.0, 1.0]), "clip needs"),
    (("token", "mask", "binary_kl", [0.1, 1.0]), "bounds a divergence"),
    (("token", "mask", "ratio", [5.0, 0.5]), "LOW 5.0 is above HIGH 0.5"),
    (("token", "mask", "ratio", [1.0, 2.0, 3.0]), "takes LOW HIGH or one HIGH"),
])
def test_invalid_is_combinations_are_rejected(args, message) -> None:
    with pytest.raises(ValueError, match=message):
        is_correction.validate(*args)
    is_correction.validate("off", *args[1:])  # off ignores the rest
