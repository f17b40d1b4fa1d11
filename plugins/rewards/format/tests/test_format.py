"""The format reward and its options."""

from __future__ import annotations

import pytest
from rlhf_plugin_format.pattern import FormatOptions, FormatReward

from rlhf.testing.conformance import ppo_config


def test_think_answer_structure() -> None:
    reward = FormatReward()
    responses = ["<think>add</think> <answer>3</answer></s>", "<answer>3</answer>", "<think>a</think><answer>3</answer> extra"]
    assert reward(["Q" + r for r in responses], ["Q"] * 3, [None] * 3) == [1.0, 0.0, 0.0]


def test_pattern_from_plugin_options() -> None:
    reward = FormatReward.from_config(ppo_config(plugins={"format": {"pattern": r"\d+"}}))
    assert reward(["Q12", "Q1a"], ["Q", "Q"], [None, None]) == [1.0, 0.0]
    with pytest.raises(ValueError, match="not a valid regular expression"):
        FormatOptions(pattern="(")
