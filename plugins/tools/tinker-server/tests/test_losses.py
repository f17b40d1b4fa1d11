"""Each loss's value and gradient with respect to the log-probs, against its formula, on random inputs."""

from __future__ import annotations

import pytest
import torch
from rlhf_plugin_ppo.loss import PPOClipLoss
from rlhf_plugin_tinker_server.losses import LossInputError, check_loss_request, datum_loss
from rlhf_plugin_tinker_server.wire import WireDatum


def _inputs(seed: int) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    logprobs = -torch.rand(32, generator=generator, dtype=torch.float64) * 3
    sampler = logprobs + 0.4 * torch.randn(32, generator=generator, dtype=torch.float64)
    return logprobs, {
        "logprobs": sampler,
        "advantages": torch.randn(32, generator=generator, dtype=torch.float64),
        "weights": torch.rand(32, generator=generator, dtype=torch.float64),
    }


def _value_and_gradient(loss_fn: str, logprobs: torch.Tensor, inputs: dict, config: dict) -> tuple[float, torch.Tensor]:
    logprobs = logprobs.clone().requires_grad_(True)
    wanted = {"weights": inputs["weights"]} if loss_fn == "cross_entropy" else inputs
    loss = datum_loss(loss_fn, logprobs, wanted, config, PPOClipLoss)
    loss.backward()
    return float(loss.detach()), logprobs.grad


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_each_loss_and_its_gradient_are_the_formula(seed: int) -> None:
    logprobs, inputs = _inputs(seed)
    q, advantages, weights = inputs["logprobs"], inputs["advantages"], inputs["weights"]
    ratio = torch.exp(logprobs - q)
    low, high = 0.8, 1.2
    clipped = ratio.clamp(low, high)
    unclipped_wins = ratio * advantages <= clipped * advantages  # where min() takes the unclipped term
    beta = 0.3
    w = weights  # every loss multiplies each token's term by its weight
    expected = {
        "cross_entropy": ({}, -(w * logprobs).sum(), -w),
        "importance_sampling": ({}, -(w * ratio * advantages).sum(), -w * ratio * advantages),
        "ppo": (
            {},
            -(w * torch.minimum(ratio * advantages, clipped * advantages)).sum(),
            torch.where(unclipped_wins, -w * ratio * advantages, torch.zeros_like(ratio)),
        ),
        "cispo": (
            {"clip_low_threshold": low, "clip_high_threshold": high},
            -(w * clipped * logprobs * advantages).sum(),
            -w * clipped * advantages,
        ),
        "dro": (
            {"beta": beta},
            -(w * (logprobs * advantages - beta / 2 * (logprobs - q) ** 2)).sum(),
            -w * (advantages - beta * (logprobs - q)),
        ),
    }
    assert (~unclipped_wins).any() and unclipped_wins.any()  # both sides of PPO's min are exercised
    for loss_fn, (config, value, gradient) in expected.items():
        got_value, got_gradient = _value_and_gradient(loss_fn, logprobs, inputs, config)
        assert got_value == pytest.approx(float(value), rel=1e-9), loss_fn
        torch.testing.assert_close(got_gradient, gradient, rtol=1e-9, atol=1e-12, msg=loss_fn)


@pytest.mark.parametrize(
    ("loss_fn", "config", "inputs", "message"),
    [
        ("gspo", {}, {}, "loss_fn 'gspo' is not supported by this server yet"),
        ("dro", {}, {"logprobs": [0.0], "advantages": [1.0]}, r"loss_fn_config\['beta'\]: dro needs it"),
        ("ppo", {"beta": 1.0}, {"logprobs": [0.0], "advantages": [1.0]}, r"loss_fn_config\['beta'\]: ppo reads clip_high"),
        ("ppo", {}, {"logprobs": [0.0], "advantages": [1.0], "mask": [1.0]}, r"\['mask'\]: ppo reads no such input"),
        ("cispo", {}, {"logprobs": [0.0]}, "cispo needs 'advantages'"),
    ],
)
def test_a_request_a_loss_cannot_compute_is_refused_naming_the_field(loss_fn, config, inputs, message) -> None:
    datum = WireDatum([1], {"target_tokens": [2], **inputs})
    with pytest.raises(LossInputError, match=message):
        check_loss_request(loss_fn, config, [datum])
