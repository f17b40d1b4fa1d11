"""The ``sync`` rollout scheduler (the default): each step generates its own batch after the previous
step trained, so the weights that generate a batch are the ones it trains, and checkpoints resume exactly."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rlhf.components import RolloutLoop


class InTurn:
    generates_ahead = False

    def batches(self, loop: RolloutLoop) -> Iterator[tuple[list[dict[str, Any]], None]]:
        while (prompts := loop.schedule.next_batch()) is not None:
            yield prompts, None
