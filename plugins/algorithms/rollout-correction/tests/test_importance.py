"""Importance-sampling correction vs its formulas, its flag checks, and its place in the actor's objective."""

from __future__ import annotations

import math

import pytest
import torch
from rlhf_plugin_rollout_correction import importance as is_correction
from rlhf_plugin_rollout_correction.importance import ImportanceSampling

from rlhf.errors import ConfigError
from rlhf.testing.conformance import ppo_config


def random_mask(batch: int, length: int, gen: torch.Generator) -> torch.Tensor:
    lengths = torch.randint(0, length + 1, (batch,), generator=gen)
    lengths[0] = 0  # always include an empty sequence
    return (torch.arange(length)[None, :] < lengths[:, None]).float()


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


def test_the_correction_reads_its_flags_and_is_active_unless_off() -> None:
    config = ppo_config(algo={"advantage": {"is_correction_level": "seq", "is_correction_threshold": [0.8, 1.25]}})
    correction = ImportanceSampling.from_config(config)
    assert correction.active and (correction.level, correction.mode, correction.threshold) == ("seq", "mask", [0.8, 1.25])
    assert not ImportanceSampling.from_config(ppo_config()).active
    with pytest.raises(ConfigError, match="clip needs --algo.advantage.is_correction_level token"):
        ImportanceSampling("seq", "clip")
