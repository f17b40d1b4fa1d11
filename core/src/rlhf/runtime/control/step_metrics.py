"""What an RL step measures besides its losses: the time of each stage, its samples' means, and the ranks' metrics
folded into one value each."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rlhf.runtime.workers.batch import Sample


@contextmanager
def timed(metrics: dict[str, float], key: str) -> Iterator[None]:
    """Adds the seconds the block took to ``metrics[key]`` (a stage that runs more than once a step sums)."""
    start = time.perf_counter()
    yield
    metrics[key] = metrics.get(key, 0.0) + time.perf_counter() - start


def sample_means(samples: list[Sample]) -> dict[str, float]:
    """The step's reward, score, response length and share of responses cut at the token limit."""
    count = len(samples)
    return {"reward": sum(s.reward for s in samples) / count, "score": sum(s.score for s in samples) / count,
            "response_length": sum(len(s.response_ids) for s in samples) / count,
            "truncated_ratio": sum(s.finish_reason == "length" for s in samples) / count}


def flatten(parts: list[list[Any]]) -> list[Any]:
    """The ranks' results of a split call, in order, as one list."""
    return [x for part in parts for x in part]


def mean_dicts(dicts: list[dict[str, float]]) -> dict[str, float]:
    """Each metric's mean over the ranks that reported it (every rank reports the same keys)."""
    keys = dicts[0].keys() if dicts else []
    return {k: sum(d[k] for d in dicts) / len(dicts) for k in keys}
