"""The math reward against hand-checked cases."""

from __future__ import annotations

import pytest
from rlhf_plugin_math.answer import MathAnswer, extract_answer, last_boxed


def test_extraction() -> None:
    assert last_boxed(r"so \boxed{\frac{1}{2}} and later \boxed{x^{2}}") == "x^{2}"
    assert last_boxed(r"\boxed{unclosed") is None
    assert extract_answer("first 12 then 3/4") == "3/4"
    assert extract_answer("no digits") is None


@pytest.mark.parametrize(("response", "label", "reward"), [
    (r"The answer is \boxed{\frac{1}{2}}</s>", "0.5", 1.0),
    ("so 47+85 = 132</s>", "132", 1.0),
    ("so it is 133", "132", 0.0),
    (r"\boxed{2x+2}", "2(x+1)", 1.0),
    ("nothing here", "1", 0.0),
])
def test_reward(response: str, label: str, reward: float) -> None:
    prompt = "Q: what? A:"
    assert MathAnswer()(prompt + response, prompt, label) == reward
