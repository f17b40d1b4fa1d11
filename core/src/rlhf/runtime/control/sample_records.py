"""A step's samples as plain records (:data:`rlhf.records.rollouts.COLUMNS`): what ``--rollout.dump_dir`` writes
and what the ``rlhf_rollout_samples`` hook hands the observers (the sample table, TensorBoard, wandb).

Runs in the controller, once per step (and per evaluation), on lists the controller already holds: no tensor,
no extra forward pass.
"""

from __future__ import annotations

import json
from typing import Any

from rlhf.records.rollouts import EXTRA_PREFIX, TERM_PREFIX
from rlhf.runtime.workers.batch import Sample


def sample_records(samples: list[Sample], step: int, advantages: list[list[float]] | None = None,
                   returns: list[list[float]] | None = None,
                   trainer_logprobs: list[list[float]] | None = None) -> list[dict[str, Any]]:
    """One record per sample; ``advantages``/``returns``/``trainer_logprobs``: per-token rows in sample order
    (None where the step has none: an evaluation, or a step that computed no trainer log-probs)."""
    records = []
    for i, sample in enumerate(samples):
        mask = sample.mask()
        model_tokens = max(1, sum(mask))
        advantage = _masked_mean(advantages[i], mask, model_tokens) if advantages is not None else None
        trained = trainer_logprobs[i] if trainer_logprobs is not None else None
        mismatch = (sum(abs(t - r) * m for t, r, m in zip(trained, sample.rollout_logprobs, mask)) / model_tokens
                    if trained is not None else None)
        record: dict[str, Any] = {
            "step": step, "sample_id": i, "group": sample.group, "policy_version": sample.policy_version,
            "prompt": sample.prompt, "prompt_ids": sample.prompt_ids, "response": sample.response,
            "response_ids": sample.response_ids, "label": _text(sample.label),
            "reward": sample.reward, "score": sample.score,
            "advantage": advantage, "return": returns[i][0] if returns is not None and returns[i] else None,
            "advantages": advantages[i] if advantages is not None else None,
            "returns": returns[i] if returns is not None else None,
            "rollout_logprobs": sample.rollout_logprobs, "trainer_logprobs": trained, "logprob_mismatch": mismatch,
            "finish_reason": sample.finish_reason, "response_length": len(sample.response_ids),
            "turns": _turns(sample.action_mask), "action_mask": sample.action_mask, "images": _images(sample.media),
        }
        record.update({TERM_PREFIX + name: value for name, value in sample.terms.items()})
        record.update({EXTRA_PREFIX + name: value for name, value in sample.columns.items()})
        records.append(record)
    return records


def _masked_mean(values: list[float], mask: list[int], count: int) -> float:
    return sum(v * m for v, m in zip(values, mask)) / count


def _text(label: Any) -> str:
    return label if isinstance(label, str) else json.dumps(label, default=str)


def _turns(action_mask: list[int] | None) -> int:
    """Runs of model tokens: a multi-turn response alternates them with the environment's."""
    if action_mask is None:
        return 1
    return sum(1 for i, m in enumerate(action_mask) if m and (i == 0 or not action_mask[i - 1]))


def _images(media: dict[str, Any] | None) -> int:
    if not media:
        return 0
    grid = media.get("image_grid_thw")  # one row per image (Qwen-VL's layout, rlhf.media)
    return len(grid) if grid is not None else 1
