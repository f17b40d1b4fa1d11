"""Conformance kits of reward functions (batched, per-sample, async) and reward shapers
(docs/plugins/reward-function.md, docs/plugins/reward-shaper.md)."""

from __future__ import annotations

from typing import Any

from rlhf.errors import RewardSourceError
from rlhf.registry import ComponentKind
from rlhf.reward_terms import call_reward
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

REWARD = ComponentKind.REWARD_FUNCTION.label
SHAPER = ComponentKind.REWARD_SHAPER.label

#: Default samples: (prompt, response, label). The last response is empty.
DEFAULT_SAMPLES = (
    ("what is 2+3?", " 5", "5"),
    ("reverse 'ab'", " ba</s>", "ba"),
    ("say hello", " <think>greet</think> <answer>hello</answer>", "hello"),
    ("what is 7*6?", " the answer is \\boxed{42}", "42"),
    ("name a colour", "", "red"),
)


def _call(function: Any, samples: list[tuple[str, str, Any]]) -> Any:
    """The runtime's own adapter (batched, per-sample, async and TRL shapes) with the runtime's extra columns."""

    prompts = [p for p, _, _ in samples]
    queries = [p + r for p, r, _ in samples]
    labels = [label for _, _, label in samples]
    return call_reward(function, queries, prompts, labels, source=REWARD,
                       prompt_ids=[[1, 2, 3]] * len(samples), response_ids=[list(range(len(r))) for _, r, _ in samples],
                       finish_reasons=["stop"] * len(samples))


def check_reward_function(function: Any, samples: list[tuple[str, str, Any]] | None = None) -> None:
    """One finite reward (and score) per sample for every batch size, empty responses included;
    the batch gives what the samples give one by one (the runtime retries failing batches per
    sample); deterministic; picklable."""
    import math

    samples = list(samples or DEFAULT_SAMPLES)

    def batch_case(size: int) -> Any:
        batch = samples[:size]

        def check() -> str | None:
            try:
                out = _call(function, batch)
            except RewardSourceError as exc:
                return str(exc).removeprefix(f"{REWARD}: ")
            bad = [i for i, (r, s) in enumerate(zip(out.rewards, out.scores)) if not (math.isfinite(r) and math.isfinite(s))]
            if bad:
                return f"sample {bad[0]} got a non-finite reward {out.rewards[bad[0]]} / score {out.scores[bad[0]]}"
            return None

        return f"{size} sample(s) {show(batch)}", check

    first_failure(REWARD, "one finite reward per sample", [batch_case(size) for size in range(1, len(samples) + 1)])

    def empty_case() -> Any:
        batch = [(p, "", label) for p, _, label in samples[:2]]
        return f"empty responses {show(batch)}", lambda: batch_case_problem(batch)

    def batch_case_problem(batch: list) -> str | None:
        out = _call(function, batch)
        if len(out.rewards) != len(batch) or not all(math.isfinite(r) for r in out.rewards):
            return f"rewards {out.rewards} for {len(batch)} empty responses"
        return None

    first_failure(REWARD, "empty responses", [empty_case()])

    def consistency() -> str | None:
        together = _call(function, samples).rewards
        alone = [_call(function, [sample]).rewards[0] for sample in samples]
        if together != alone:
            return f"the batch gives {together} but the samples one by one give {alone}"
        if _call(function, samples).rewards != together:
            return "two calls on the same samples differ (not deterministic)"
        return None

    first_failure(REWARD, "batch equals per-sample and deterministic", [(f"{len(samples)} samples", consistency)])
    check_picklable(REWARD, function)


class RewardFunctionKit(ContractProperties, ComponentKit):
    """pytest kit: ``class TestMine(RewardFunctionKit): component = my_reward; plugin_module = …; registered_name = …``.

    Override :meth:`samples` with ``(prompt, response, label)`` triples your reward understands.
    """

    kind = ComponentKind.REWARD_FUNCTION
    contract_properties = ("one finite reward per sample", "empty responses", "batch equals per-sample and deterministic", "picklable for Ray",)

    def samples(self) -> list[tuple[str, str, Any]]:
        return list(DEFAULT_SAMPLES)

    @not_collected
    def test_contract(self) -> None:
        check_reward_function(self.make_component(), self.samples())


# ------------------------------------------------------------------ shapers


def _shaper_inputs(batch: int, seed: int, max_length: int) -> tuple[Any, dict[str, Any]]:
    import torch

    gen = tt.generator(seed)
    lengths = torch.randint(0, max_length + 1, (batch,), generator=gen)
    lengths[-1] = 0  # an empty response
    lengths[0] = max_length  # a response that hit the limit
    truncated = lengths >= max_length
    return tt.randn(batch, seed=seed), {"response_lengths": lengths, "truncated": truncated}


def check_reward_shaper(shaper: Any, max_length: int = 16) -> None:
    """``(B,) -> (B,)`` fp32, finite (empty and truncated responses included), input untouched,
    deterministic, traits declared, picklable. ``max_length`` is the longest response of the inputs."""
    import torch

    if not isinstance(getattr(shaper, "order", None), int):
        raise fail(SHAPER, "declares its traits", f"order must be an int, got {getattr(shaper, 'order', None)!r}")
    if getattr(shaper, "active", None) is not True:
        raise fail(SHAPER, "kit set-up", f"the shaper under test has active={getattr(shaper, 'active', None)!r}; "
                   "build an active one (override make_component, or set options in run_config)")

    def case(batch: int) -> Any:
        rewards, info = _shaper_inputs(batch, batch, max_length)

        def check() -> str | None:
            before = rewards.clone()
            out = shaper.apply(rewards, info)
            if not torch.equal(rewards, before):
                return "modified its input rewards in place"
            if tuple(out.shape) != (batch,):
                return f"returned shape {tuple(out.shape)}, expected {(batch,)}"
            if out.dtype != torch.float32:
                return f"returned {out.dtype}, expected torch.float32"
            if not torch.isfinite(out).all():
                return f"returned non-finite rewards {show(out)}"
            if not torch.equal(shaper.apply(rewards.clone(), info), out):
                return "two calls on the same rewards differ (not deterministic)"
            return None

        return f"rewards={show(rewards)}, response_lengths={show(info['response_lengths'])}, " \
               f"truncated={show(info['truncated'])}", check

    first_failure(SHAPER, "shape/dtype/finite", [case(batch) for batch in (2, 3, 8)])
    check_picklable(SHAPER, shaper)


class RewardShaperKit(ContractProperties, ComponentKit):
    """pytest kit: ``class TestMine(RewardShaperKit): plugin_module = …; registered_name = …`` and a
    :meth:`make_component` returning an *active* shaper (``max_length``: the longest response it sees)."""

    kind = ComponentKind.REWARD_SHAPER
    contract_properties = ("declares its traits", "shape/dtype/finite", "picklable for Ray",)
    max_length: int = 16

    @not_collected
    def test_contract(self) -> None:
        check_reward_shaper(self.make_component(), self.max_length)
