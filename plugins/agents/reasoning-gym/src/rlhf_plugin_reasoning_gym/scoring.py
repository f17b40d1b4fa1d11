"""The reward: reasoning-gym's own ``score_answer`` of what a response puts in its answer tag."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rlhf.errors import DataError
from rlhf_plugin_reasoning_gym.tasks import ENTRY_FIELD


class ReasoningGymScore:
    """``rewards`` and ``scores``: each task's score of the response's ``<answer>``, 0.0 where there is none."""

    def __call__(self, queries: Sequence[str], prompts: Sequence[str], labels: Sequence[Any], **columns: Any) -> Any:
        from reasoning_gym import get_score_answer_fn
        from reasoning_gym.utils import extract_answer

        fields = columns.get("fields") or [{}] * len(queries)
        scores = []
        for index, (query, prompt, row) in enumerate(zip(queries, prompts, fields)):
            entry = row.get(ENTRY_FIELD)
            if entry is None:
                raise DataError(f"reward reasoning_gym: sample {index} has no {ENTRY_FIELD!r} field; its prompts must come "
                                "from --data.prompt_source reasoning_gym (or rows that carry reasoning-gym's entry)")
            answer = extract_answer(query[len(prompt):])
            score_answer = get_score_answer_fn(entry["metadata"]["source_dataset"])
            scores.append(0.0 if answer is None else float(score_answer(answer=answer, entry=entry)))
        return {"rewards": scores, "scores": scores}
