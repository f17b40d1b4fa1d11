"""GAE and PPO-clip against their formulas, on random inputs."""

from __future__ import annotations

import pytest
import torch
from rlhf_plugin_ppo.gae import GAE
from rlhf_plugin_ppo.loss import PPOClipLoss


def random_mask(batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    lengths = torch.randint(0, length + 1, (batch,), generator=gen)  # includes empty responses
    return (torch.arange(length)[None, :] < lengths[:, None]).float()


def gae_reference(rewards, values, mask, gamma, lambd):
    """Straight from the recurrence, one scalar at a time."""
    batch, length = rewards.shape
    adv = torch.zeros(batch, length, dtype=torch.float64)
    for b in range(batch):
        last = 0.0
        for t in reversed(range(length)):
            v_next = values[b, t + 1] * mask[b, t + 1] if t + 1 < length else 0.0
            delta = rewards[b, t] * mask[b, t] + gamma * v_next - values[b, t] * mask[b, t]
            last = delta + gamma * lambd * last
            adv[b, t] = last
    return adv, adv + values * mask


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gae_matches_the_recurrence(seed: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(seed)
    gamma, lambd = torch.rand(2, generator=gen).tolist()
    rewards = torch.randn(6, 9, generator=gen).to(dtype)
    values = torch.randn(6, 9, generator=gen).to(dtype)
    mask = random_mask(6, 9, gen)
    adv, ret = GAE().advantages(rewards, mask, values, gamma, lambd)
    assert adv.dtype == torch.float32
    ref_adv, ref_ret = gae_reference(rewards.double(), values.double(), mask.double(), gamma, lambd)
    torch.testing.assert_close(adv.double(), ref_adv, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ret.double(), ref_ret, atol=1e-5, rtol=1e-5)


def test_gae_traits_and_missing_critic() -> None:
    assert GAE.needs_critic and GAE.whiten and GAE.min_samples_per_prompt == 1
    with pytest.raises(ValueError, match="needs critic values"):
        GAE().advantages(torch.zeros(1, 2), torch.ones(1, 2), None, 1.0, 1.0)


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("dual_clip", [None, 3.0])
def test_ppo_clip_loss_matches_the_formula(seed: int, dual_clip: float | None) -> None:
    gen = torch.Generator().manual_seed(seed)
    log_probs = torch.randn(5, 7, generator=gen) * 3  # extreme ratios included
    old = torch.randn(5, 7, generator=gen) * 3
    adv = torch.randn(5, 7, generator=gen)
    mask = random_mask(5, 7, gen)
    low, high = 0.2, 0.28
    loss, metrics = PPOClipLoss(low, high, dual_clip)(log_probs, old, adv, mask)
    for b in range(5):
        for t in range(7):
            ratio = torch.exp(torch.clamp(log_probs[b, t] - old[b, t], -20, 20))
            clipped = torch.clamp(ratio, 1 - low, 1 + high) * adv[b, t]
            term = min(ratio * adv[b, t], clipped)
            if dual_clip is not None and adv[b, t] < 0:
                term = max(term, dual_clip * adv[b, t])
            assert loss[b, t].item() == pytest.approx(-term.item() * mask[b, t].item(), rel=1e-6, abs=1e-6)
    n = mask.sum().clamp(min=1)
    expected_ratio = (((torch.clamp(torch.exp(log_probs - old), 1 - low, 1 + high) * adv) < torch.exp(log_probs - old) * adv).float() * mask).sum() / n
    assert metrics["ppo_clip_ratio"].item() == pytest.approx(expected_ratio.item(), abs=1e-6)
    assert metrics["ppo_kl"].item() == pytest.approx((((old - log_probs) * mask).sum() / n).item(), abs=1e-5)


def test_ppo_loss_gradient_is_zero_outside_the_clip_region() -> None:
    log_probs = torch.tensor([[0.5, -0.5]], requires_grad=True)  # ratio e^0.5 > 1.2 and e^-0.5 < 0.8
    loss, _ = PPOClipLoss(0.2, 0.2)(log_probs, torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]), torch.ones(1, 2))
    loss.sum().backward()
    assert torch.equal(log_probs.grad, torch.zeros(1, 2))


def test_dual_clip_must_exceed_one() -> None:
    with pytest.raises(ValueError, match="must be > 1"):
        PPOClipLoss(dual_clip=1.0)
