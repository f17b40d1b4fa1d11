"""Weighted reward terms: the adapter for every function shape, weights, logs, scores and failure policies."""

from __future__ import annotations

import math

import pytest
from rlhf_plugin_weighted_rewards.terms import CompositeReward, TermSpec, parse_terms

from rlhf.errors import RewardSourceDown, RewardSourceError
from rlhf.reward_output import RewardOutput
from rlhf.reward_terms import call_reward

QUERIES, PROMPTS, LABELS = ["Q:a", "Q:bb", "Q:ccc"], ["Q:", "Q:", "Q:"], ["1", "2", "3"]


def test_parse_terms() -> None:
    assert parse_terms("math_answer:1.0,format:0.1:zero") == [TermSpec("math_answer", 1.0), TermSpec("format", 0.1, "zero")]
    assert parse_terms([{"name": "a", "weight": 2}, "b"], "skip-sample") == [TermSpec("a", 2.0, "skip-sample"),
                                                                             TermSpec("b", 1.0, "skip-sample")]
    for bad, message in (("a:x", "weight 'x' is not a number"), ("a:1:explode", "on_error 'explode'"),
                         ("a,a", "names a more than once"), ("a:1:zero:extra", "expected name")):
        with pytest.raises(ValueError, match=message):
            parse_terms(bad)


def batched(queries, prompts, labels, **kwargs):
    return {"rewards": [len(q) - len(p) for q, p in zip(queries, prompts)], "extra_logs": {"calls": [1.0] * len(queries)}}


class PerSample:
    per_sample = True

    def __call__(self, query, prompt, label, **kwargs):
        return {"reward": float(query.endswith(label)), "score": 0.5}


async def async_reward(queries, prompts, labels, **kwargs):
    return [1.0] * len(queries)


def trl_style(prompts, completions, **kwargs):
    return [float(len(c)) * 10 for c in completions]


def test_adapter_accepts_every_shape() -> None:
    assert call_reward(batched, QUERIES, PROMPTS, LABELS, source="b").rewards == [1.0, 2.0, 3.0]
    out = call_reward(PerSample(), ["Q:1", "Q:x", "Q:3"], PROMPTS, LABELS, source="p")
    assert (out.rewards, out.scores) == ([1.0, 0.0, 1.0], [0.5, 0.5, 0.5])
    assert call_reward(async_reward, QUERIES, PROMPTS, LABELS, source="a").rewards == [1.0, 1.0, 1.0]
    assert call_reward(trl_style, QUERIES, PROMPTS, LABELS, source="t").rewards == [10.0, 20.0, 30.0]
    with pytest.raises(RewardSourceError, match="returned 2 rewards for 3 samples"):
        call_reward(lambda q, p, labels: [1.0, 2.0], QUERIES, PROMPTS, LABELS, source="short")


def term(function):
    return lambda q, p, labels, **c: call_reward(function, q, p, labels, source="t", **c)


def test_weighted_sum_logs_each_term_and_scores_from_a_named_term() -> None:
    composite = CompositeReward([(TermSpec("len", 1.0), term(batched)), (TermSpec("per", 0.5), term(PerSample()))], "per")
    out = composite(["Q:1", "Q:x", "Q:3"], PROMPTS, LABELS)
    assert out.rewards == [1.5, 1.0, 1.5]
    assert out.scores == [0.5, 0.5, 0.5]
    assert out.logs == {"reward/len": 1.0, "reward/len/calls": 1.0, "reward/per": 2 / 3}
    assert CompositeReward([(TermSpec("len", 2.0), term(batched))])(QUERIES, PROMPTS, LABELS).scores == [2.0, 4.0, 6.0]
    with pytest.raises(ValueError, match="--reward.score_term 'nope' is not one of the reward terms"):
        CompositeReward([(TermSpec("len"), term(batched))], "nope")


def flaky(queries, prompts, labels, **kwargs):
    if any("bad" in q for q in queries):
        raise RuntimeError("third-party bug")
    return [1.0] * len(queries)


@pytest.mark.parametrize("policy", ["raise", "zero", "skip-sample"])
def test_failure_policies_isolate_the_failing_sample(policy: str) -> None:
    composite = CompositeReward([(TermSpec("ok", 1.0), term(batched)), (TermSpec("flaky", 1.0, policy), term(flaky))])
    queries = ["Q:a", "Q:bad", "Q:c"]
    if policy == "raise":
        with pytest.raises(RewardSourceError, match="reward term 'flaky' failed: RuntimeError: third-party bug"):
            composite(queries, PROMPTS, LABELS)
        return
    out = composite(queries, PROMPTS, LABELS)
    assert out.rewards == [2.0, 3.0, 2.0]  # the bad sample gets 0 from the flaky term only
    assert out.logs["reward_failures/flaky"] == 1.0
    assert out.skipped == ({1} if policy == "skip-sample" else set())


def test_a_reward_output_passes_through() -> None:
    out = call_reward(lambda q, p, labels: RewardOutput([1.0] * len(q), [0.0] * len(q)), QUERIES, PROMPTS, LABELS, source="x")
    assert out.rewards == [1.0, 1.0, 1.0] and out.scores == [0.0, 0.0, 0.0]


def sometimes_nan(queries, prompts, labels, **kwargs):
    values = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
    return {"rewards": [values.get(q[2:], 1.0) for q in queries], "scores": [1.0] * len(queries)}


@pytest.mark.parametrize("policy", ["raise", "zero", "skip-sample"])
def test_non_finite_rewards_are_failures_of_their_samples(policy: str) -> None:
    composite = CompositeReward([(TermSpec("ok", 1.0), term(batched)), (TermSpec("nanny", 1.0, policy), term(sometimes_nan))])
    queries = ["Q:nan", "Q:b", "Q:inf", "Q:-inf"]
    if policy == "raise":
        with pytest.raises(RewardSourceError, match="reward term 'nanny' failed on sample 0 \\(non-finite reward nan"):
            composite(queries, ["Q:"] * 4, LABELS + ["4"])
        return
    out = composite(queries, ["Q:"] * 4, LABELS + ["4"])
    assert all(math.isfinite(r) for r in out.rewards + out.scores)
    assert out.rewards == [3.0, 2.0, 3.0, 4.0]  # NaN/inf samples get 0 from the failing term, len(response) from "ok"
    assert out.logs["reward_failures/nanny"] == 3.0
    assert out.skipped == ({0, 2, 3} if policy == "skip-sample" else set())


@pytest.mark.parametrize("policy", ["zero", "skip-sample"])
def test_a_term_failing_on_every_sample_is_an_error_whatever_the_policy(policy: str) -> None:
    def down(queries, prompts, labels, **kwargs):
        raise ConnectionError("connection refused")

    def all_nan(queries, prompts, labels, **kwargs):
        return [math.nan] * len(queries)

    for function, reason in ((down, "ConnectionError: connection refused"), (all_nan, "non-finite reward nan")):
        composite = CompositeReward([(TermSpec("broken", 1.0, policy), term(function))])
        with pytest.raises(RewardSourceError, match=f"'broken' failed on all 3 samples of the batch \\(first: {reason}"):
            composite(QUERIES, PROMPTS, LABELS)


def test_a_source_that_gives_no_answer_fails_the_batch_at_once() -> None:
    calls = []

    def down(queries, prompts, labels, **kwargs):
        calls.append(len(queries))
        raise RewardSourceDown("remote reward http://127.0.0.1:9/get_reward failed after 5 tries: cannot connect")

    composite = CompositeReward([(TermSpec("remote_http", 1.0, "skip-sample"), term(down))])
    with pytest.raises(RewardSourceError, match="reward term 'remote_http' failed: remote reward http://127.0.0.1:9/") as err:
        composite(QUERIES, PROMPTS, LABELS)
    assert calls == [3]  # no per-sample retries: each would wait for the same dead server
    assert "--reward.on_error" not in str(err.value)  # no policy can help
