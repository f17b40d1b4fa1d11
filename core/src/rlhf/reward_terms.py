"""One adapter for every reward function shape a run accepts.

OpenRLHF's batched ``f(queries, prompts, labels, **kwargs)``; per-sample functions (``per_sample =
True`` attribute: called once per sample with scalars); ``async`` functions; and TRL's
``f(prompts, completions, **dataset_columns)`` (detected by a ``completions`` parameter). The result
is normalised and checked (:func:`rlhf.reward_output.normalize_reward_output`). Runs wherever a reward
is computed: the controller (a run's reward sources, :class:`rlhf.components.RewardSources`) or a reward server.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

from rlhf.reward_output import RewardOutput, normalize_reward_output

__all__ = ["call_reward"]


def call_reward(function: Any, queries: list[str], prompts: list[str], labels: list[Any], source: str,
                **columns: Any) -> RewardOutput:
    """Call any supported reward function shape and normalise its result."""
    parameters = inspect.signature(function).parameters
    if getattr(function, "per_sample", False):
        results = [_run(function(q, p, label, **{k: v[i] for k, v in columns.items()}))
                   for i, (q, p, label) in enumerate(zip(queries, prompts, labels))]
        return normalize_reward_output(_merge(results), len(queries), source)
    if "completions" in parameters:  # TRL's convention
        completions = [q[len(p):] for q, p in zip(queries, prompts)]
        result = _run(function(prompts=prompts, completions=completions, labels=labels, **columns))
    else:
        result = _run(function(queries, prompts, labels, **columns))
    return normalize_reward_output(result, len(queries), source)


def _run(value: Any) -> Any:
    return asyncio.run(value) if inspect.isawaitable(value) else value


def _merge(results: list[Any]) -> dict[str, Any]:
    """Per-sample results (a number or a dict) -> one batched dict."""
    rewards, scores, extra, columns = [], [], {}, {}
    for i, result in enumerate(results):
        if isinstance(result, dict):
            for key, value in (result.get("columns") or {}).items():  # a sample's own value: one per column
                columns.setdefault(key, [None] * len(results))[i] = value
            rewards.append(float(result["rewards"] if "rewards" in result else result["reward"]))
            scores.append(float(result.get("scores", result.get("score", rewards[-1]))))
            for key, value in (result.get("extra_logs") or {}).items():
                extra.setdefault(key, []).append(float(value))
        else:
            rewards.append(float(result))
            scores.append(rewards[-1])
    return {"rewards": rewards, "scores": scores, "extra_logs": extra, "columns": columns}
