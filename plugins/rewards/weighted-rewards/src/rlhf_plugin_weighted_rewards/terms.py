"""Weighted reward terms, each logged, each with its own failure policy.

``--reward.functions math_answer:1.0,format:0.1:zero`` (``name[:weight[:on_error]]``) or in
YAML ``reward: {functions: [{name: math_answer, weight: 1.0}, {name: format, weight: 0.1, on_error: zero}]}``.

Failure policies: ``raise`` (stop the run), ``zero`` (a failing sample gets 0 from this term,
counted in ``reward_failures/<term>``) and ``skip-sample`` (a failing sample's group is left out
of this step, counted too). A batch that fails is retried sample by sample so one bad sample
does not take the batch with it. Runs in the controller, once per generated batch.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rlhf.components import RewardResult
from rlhf.errors import RewardSourceDown, RewardSourceError
from rlhf.reward_output import RewardOutput, non_finite_samples

log = logging.getLogger("rlhf.rewards")

POLICIES = ("raise", "zero", "skip-sample")


@dataclass(frozen=True)
class TermSpec:
    name: str
    weight: float = 1.0
    on_error: str = "raise"


def parse_terms(value: Any, default_policy: str = "raise") -> list[TermSpec]:
    """``"a:1.0,b:0.1:zero"`` or a list of names / ``{name, weight, on_error}`` dicts."""
    if value is None:
        return []
    items = value if isinstance(value, list) else [v for v in str(value).split(",") if v.strip()]
    terms = []
    for item in items:
        if isinstance(item, dict):
            spec = TermSpec(str(item["name"]), float(item.get("weight", 1.0)), str(item.get("on_error", default_policy)))
        else:
            parts = [p.strip() for p in str(item).split(":")]
            if len(parts) > 3 or not parts[0]:
                raise ValueError(f"--reward.functions {item!r}: expected name[:weight[:on_error]]")
            try:
                weight = float(parts[1]) if len(parts) > 1 and parts[1] else 1.0
            except ValueError:
                raise ValueError(f"--reward.functions {item!r}: weight {parts[1]!r} is not a number") from None
            spec = TermSpec(parts[0], weight, parts[2] if len(parts) > 2 else default_policy)
        if spec.on_error not in POLICIES:
            raise ValueError(f"--reward.functions {spec.name}: on_error {spec.on_error!r} is not one of {', '.join(POLICIES)}")
        terms.append(spec)
    names = [t.name for t in terms]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"--reward.functions names {', '.join(duplicates)} more than once")
    return terms


class CompositeReward:
    """Σ weight·term over the configured terms; ``score_term`` picks the scores used for filtering.

    A term fails for a sample when it raises or gives a non-finite reward or score (NaN/inf
    never reach the loss). Its policy decides: ``raise`` stops the run with a
    :class:`RewardSourceError`; ``zero`` and ``skip-sample`` count the failure. A term that fails
    on every sample of a batch is broken, not flaky (a server down, a bug): an error whatever
    the policy, so no run trains on rewards that are all stand-ins; a source that gives no
    answer at all (:class:`RewardSourceDown`) fails the batch at once, without per-sample retries.
    """

    def __init__(self, terms: list[tuple[TermSpec, Callable[..., RewardOutput]]], score_term: str | None = None) -> None:
        if score_term is not None and score_term not in [spec.name for spec, _ in terms]:
            raise ValueError(f"--reward.score_term {score_term!r} is not one of the reward terms "
                             f"({', '.join(spec.name for spec, _ in terms)})")
        self.terms, self.score_term = terms, score_term

    def __call__(self, queries: list[str], prompts: list[str], labels: list[Any], **columns: Any) -> RewardResult:
        count = len(queries)
        total = [0.0] * count
        scores: list[float] | None = None
        out = RewardResult(total, [0.0] * count)
        for spec, term in self.terms:
            try:
                result = term(queries, prompts, labels, **columns)
                failures = non_finite_samples(result)
            except Exception as exc:  # noqa: BLE001 - a term's own failure, handled by its policy
                if spec.on_error == "raise" or isinstance(exc, RewardSourceDown):
                    raise _term_error(spec, exc) from exc
                log.warning("reward term %r failed on a batch (%s: %s); retrying sample by sample, policy %s",
                            spec.name, type(exc).__name__, exc, spec.on_error)
                result, failures = self._per_sample(term, queries, prompts, labels, columns)
            if failures:
                self._handle_failures(spec, failures, count, result, out)
            for i, value in enumerate(result.rewards):
                total[i] += spec.weight * value
            out.logs[f"reward/{spec.name}"] = sum(result.rewards) / max(count, 1)
            out.terms[spec.name] = list(result.rewards)
            out.columns.update({f"{spec.name}/{name}": values for name, values in result.columns.items()})
            for key, value in result.extra_logs.items():
                out.logs[f"reward/{spec.name}/{key}"] = value
            if spec.name == self.score_term:
                scores = list(result.scores)
        out.scores = scores if scores is not None else list(total)
        return out

    @staticmethod
    def _per_sample(term: Callable[..., RewardOutput], queries: list[str], prompts: list[str], labels: list[Any],
                    columns: dict[str, Any]) -> tuple[RewardOutput, dict[int, str]]:
        """Call the term once per sample; returns the results and the reason of each sample that failed."""
        rewards, scores = [0.0] * len(queries), [0.0] * len(queries)
        failures: dict[int, str] = {}
        for i in range(len(queries)):
            try:
                single = term([queries[i]], [prompts[i]], [labels[i]], **{k: [v[i]] for k, v in columns.items()})
            except Exception as exc:  # noqa: BLE001 - counted and handled by the policy
                failures[i] = f"{type(exc).__name__}: {exc}"
                continue
            bad = non_finite_samples(single)
            if bad:
                failures[i] = bad[0]
                continue
            rewards[i], scores[i] = single.rewards[0], single.scores[0]
        return RewardOutput(rewards, scores), failures

    @staticmethod
    def _handle_failures(spec: TermSpec, failures: dict[int, str], count: int, result: RewardOutput,
                         out: RewardResult) -> None:
        """Apply ``spec``'s policy to the failed samples: an error, or 0 for this term (and, for
        ``skip-sample``, the sample's group left out), counted in ``reward_failures/<term>``."""
        first, reason = next(iter(failures.items()))
        if len(failures) == count:
            raise RewardSourceError(f"reward term {spec.name!r} failed on all {count} samples of the batch "
                                    f"(first: {reason}); fix the reward source")
        if spec.on_error == "raise":
            raise RewardSourceError(f"reward term {spec.name!r} failed on sample {first} ({reason}); fix the reward "
                                    "source or set --reward.on_error zero|skip-sample")
        log.warning("reward term %r failed on %d of %d samples (first: sample %d, %s); policy %s",
                    spec.name, len(failures), count, first, reason, spec.on_error)
        for i in failures:
            result.rewards[i] = result.scores[i] = 0.0
            if spec.on_error == "skip-sample":
                out.skipped.add(i)
        out.logs[f"reward_failures/{spec.name}"] = float(len(failures))


def _term_error(spec: TermSpec, exc: Exception) -> RewardSourceError:
    reason = str(exc) if isinstance(exc, RewardSourceError) else f"{type(exc).__name__}: {exc}"
    if isinstance(exc, RewardSourceDown):  # no policy keeps a run going without its reward source
        return RewardSourceError(f"reward term {spec.name!r} failed: {reason}")
    return RewardSourceError(f"reward term {spec.name!r} failed: {reason}; fix the reward source or set "
                             "--reward.on_error zero|skip-sample to keep training past failing samples")
