"""Trainers on preference pairs (reward models, DPO): examples, batches and units shared by them.

A batch holds the N chosen sequences first and the N rejected ones after them, in one
forward (see :func:`rlhf_supervised.batch.collate_pairs`); the loss is a mean over pairs.
"""

from __future__ import annotations

from typing import Any

from rlhf_supervised.batch import collate_pairs
from rlhf_supervised.conversations import preference_pair
from rlhf_supervised.trainer import SupervisedTrainer


class PairwiseTrainer(SupervisedTrainer):
    """Reads ``--data.prompt_key/chosen_key/rejected_key/margin_key`` rows; units are pairs."""

    def build_examples(self, rows: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
        return [preference_pair(row, self.config.data, self.tokenizer, source, i) for i, row in enumerate(rows)]

    def collate(self, examples: list[dict[str, Any]]) -> Any:
        return collate_pairs(examples, self.pad_id, self.config.ds.packing_samples)

    def units(self, batch: Any) -> float:
        return float(batch.num_samples // 2)
