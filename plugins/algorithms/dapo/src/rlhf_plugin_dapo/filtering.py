"""The dynamic-filtering rule (see the package docstring)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class DapoOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    drop_zero_variance: bool = Field(False, description="also drop groups whose scores are all equal (non-binary rewards)")


class DynamicFilter:
    def __init__(self, low: float = 0.0, high: float = 1.0, drop_zero_variance: bool = False) -> None:
        self.low, self.high, self.drop_zero_variance = low, high, drop_zero_variance

    @classmethod
    def from_config(cls, config: Any) -> DynamicFilter:
        low, high = config.algo.dynamic_filtering_range
        options = DapoOptions.model_validate(config.plugins.get("dapo", {}))
        return cls(low, high, options.drop_zero_variance)

    def keep(self, scores: Any) -> Any:
        """Boolean ``(P,)`` from the ``(P, n)`` score matrix."""
        from rlhf.ops import as_float

        scores = as_float(scores)
        mean = scores.mean(dim=1)
        keep = (mean > self.low) & (mean < self.high)
        if self.drop_zero_variance:
            keep &= (scores.max(dim=1).values - scores.min(dim=1).values) > 0
        return keep
