"""DAPO dynamic filtering and its options."""

from __future__ import annotations

import pytest
import torch
from rlhf_plugin_dapo import DAPO_PRESET
from rlhf_plugin_dapo.filtering import DynamicFilter

from rlhf.testing.conformance import ppo_config


def test_keeps_groups_strictly_inside_the_range() -> None:
    scores = torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 1.0], [0.0, 1.0, 1.0], [0.5, 0.5, 0.5]])
    assert DynamicFilter(0.0, 1.0).keep(scores).tolist() == [False, False, True, True]
    assert DynamicFilter(0.0, 1.0, drop_zero_variance=True).keep(scores).tolist() == [False, False, True, False]
    assert DynamicFilter(0.4, 0.6).keep(scores).tolist() == [False, False, False, True]


def test_options_come_from_the_plugin_namespace() -> None:
    cfg = ppo_config(plugins={"dapo": {"drop_zero_variance": True}})
    cfg.algo.dynamic_filtering_range = [0.1, 0.9]
    made = DynamicFilter.from_config(cfg)
    assert (made.low, made.high, made.drop_zero_variance) == (0.1, 0.9, True)
    with pytest.raises(ValueError, match="drop_zero_varianse"):
        DynamicFilter.from_config(ppo_config(plugins={"dapo": {"drop_zero_varianse": True}}))


def test_preset_is_the_published_recipe() -> None:
    assert DAPO_PRESET["actor.eps_clip_low_high"] == [0.2, 0.27]
    assert DAPO_PRESET["algo.kl.estimator"] == "k3" and DAPO_PRESET["algo.kl.init_coef"] == 1e-3
