"""The one shape every reward function's result is turned into.

Accepted results (OpenRLHF's ``reward_func`` contract): a tensor or list of ``B``
rewards, or a dict with ``rewards`` (``B``), optional ``scores`` (``B``, used for
filtering; defaults to the rewards), optional ``extra_logs`` (name -> ``B`` values
or a scalar), logged as means, and optional ``columns`` (name -> ``B`` values: text or
numbers), shown per sample in the sample table, ``--rollout.dump_dir`` and ``rlhf rollouts``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from rlhf.errors import RewardSourceError


@dataclass
class RewardOutput:
    rewards: list[float]
    scores: list[float]
    extra_logs: dict[str, float] = field(default_factory=dict)
    columns: dict[str, list[Any]] = field(default_factory=dict)  # name -> one value per sample (text or a number)


def _floats(values: Any, what: str, count: int, source: str) -> list[float]:
    if hasattr(values, "tolist"):
        values = values.tolist()
    if isinstance(values, (int, float)):
        values = [values]
    try:
        out = [float(v) for v in values]
    except (TypeError, ValueError) as exc:
        raise RewardSourceError(f"{source}: {what} must be numbers, got {values!r:.200}") from exc
    if len(out) != count:
        raise RewardSourceError(f"{source}: returned {len(out)} {what} for {count} samples")
    return out


def normalize_reward_output(result: Any, count: int, source: str) -> RewardOutput:
    """Validate a reward function's result for ``count`` samples; errors name ``source``."""
    if isinstance(result, RewardOutput):
        result = {"rewards": result.rewards, "scores": result.scores, "extra_logs": result.extra_logs,
                  "columns": result.columns}
    if isinstance(result, dict):
        if "rewards" not in result:
            raise RewardSourceError(f"{source}: the returned dict has no 'rewards' key (keys: {', '.join(result)})")
        rewards = _floats(result["rewards"], "rewards", count, source)
        scores = _floats(result["scores"], "scores", count, source) if result.get("scores") is not None else list(rewards)
        extra = {}
        for name, values in (result.get("extra_logs") or {}).items():
            if hasattr(values, "tolist"):
                values = values.tolist()
            values = values if isinstance(values, list) else [values]
            extra[name] = sum(float(v) for v in values) / max(len(values), 1)
        return RewardOutput(rewards, scores, extra, _columns(result.get("columns"), count, source))
    rewards = _floats(result, "rewards", count, source)
    return RewardOutput(rewards, list(rewards))


def _columns(columns: Any, count: int, source: str) -> dict[str, list[Any]]:
    """``columns``: name -> ``count`` values, each text, a number, a bool or None (what a Parquet column holds)."""
    out = {}
    for name, values in (columns or {}).items():
        values = values.tolist() if hasattr(values, "tolist") else values
        if not isinstance(values, list) or len(values) != count:
            raise RewardSourceError(f"{source}: column {name!r} must hold one value per sample ({count}), "
                                    f"got {values!r:.200}")
        if not all(v is None or isinstance(v, (str, int, float, bool)) for v in values):
            raise RewardSourceError(f"{source}: column {name!r} must hold text or numbers, got {values!r:.200}")
        out[str(name)] = values
    return out


def non_finite_samples(output: RewardOutput) -> dict[int, str]:
    """Samples whose reward or score is NaN or ±inf, each with its values in words."""
    return {i: f"non-finite reward {reward} / score {score}"
            for i, (reward, score) in enumerate(zip(output.rewards, output.scores))
            if not (math.isfinite(reward) and math.isfinite(score))}
