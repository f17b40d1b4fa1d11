"""Prompt datasets for RL: local json/jsonl/parquet files or saved dataset dirs, via ``datasets``.

Each row becomes ``{"prompt": str, "prompt_ids": list[int], "label": Any}``. The
order is a seeded shuffle per episode, so a resumed run continues with exactly
the batches an uninterrupted run would have seen.
"""

from __future__ import annotations

import logging
import random
from typing import Any

from rlhf.data.sources import load_mixed, row_value, text_value
from rlhf.data.templates import format_prompt
from rlhf.errors import DataError

log = logging.getLogger("rlhf.data")


def load_prompt_rows(data_cfg: Any, seed: int) -> list[dict[str, Any]]:
    """Load, mix (``--data.prompt_probs``) and truncate (``--data.max_samples``) the prompt datasets."""
    return load_mixed(data_cfg.prompt_dataset, data_cfg.prompt_probs, data_cfg.prompt_split, data_cfg.max_samples, seed,
                      "--data.prompt_dataset", "--data.prompt_probs")


def build_prompts(rows: list[dict[str, Any]], data_cfg: Any, tokenizer: Any, source: str,
                  workers: int = 0, processor: Any = None) -> list[dict[str, Any]]:
    """Apply the chat template / input template and tokenize each row (in ``workers`` worker
    processes, ``--data.dataloader_num_workers``; the result is the same for any number). With a
    ``processor`` (a :class:`rlhf.components.Processor`, e.g. a VLM's), the processor turns each row
    into the prompt text, ids and ``media`` instead (its :class:`DataError` is reported with the
    file and row).

    Prompts that are empty, or whose tokens leave no room for a response within
    ``--data.max_len``, are dropped with one warning that counts them and names their rows
    (OpenRLHF filters over-long prompts too), or are an error with ``--data.on_invalid_prompt error``.
    """
    from rlhf.data.workers import chunks, computed_in_order

    def prepare(part: list[tuple[int, dict[str, Any]]]) -> list[tuple[str | None, dict[str, Any] | None]]:
        return [_prepare(index, row, data_cfg, tokenizer, source, processor) for index, row in part]

    prompts = []
    invalid: dict[str, list[int]] = {}
    outcomes = computed_in_order(prepare, chunks(list(enumerate(rows)), _ROWS_PER_TASK), workers)
    for index, (why, prompt) in enumerate(outcome for part in outcomes for outcome in part):
        if why is not None:
            invalid.setdefault(why, []).append(index)
        else:
            prompts.append(prompt)
    if invalid:
        found = "; ".join(f"{len(rows_)} {why} ({_row_list(rows_)})" for why, rows_ in invalid.items())
        if data_cfg.on_invalid_prompt == "error":
            raise DataError(f"{source}: invalid prompts: {found}; fix them or set --data.on_invalid_prompt filter")
        log.warning("%s: dropped %d of %d prompts: %s (--data.on_invalid_prompt error makes this an error)",
                    source, sum(len(r) for r in invalid.values()), len(rows), found)
    if not prompts:
        raise DataError(f"{source}: no usable prompt is left ({len(rows)} rows, all invalid)")
    return prompts


#: Rows one worker task prepares (large enough that handing results back costs little).
_ROWS_PER_TASK = 256


def _prepare(index: int, row: dict[str, Any], data_cfg: Any, tokenizer: Any, source: str,
             processor: Any) -> tuple[str | None, Any]:
    """``(None, prompt)`` for a usable row, ``(why, None)`` for an invalid one; a missing key raises."""
    value = text_value(row, data_cfg.input_key, "--data.input_key", source, index)
    if data_cfg.label_key:
        row_value(row, data_cfg.label_key, "--data.label_key", source, index)
    if not _has_text(value):
        return "empty", None
    extra: dict[str, Any] = {}
    if processor is None:
        text, ids = format_prompt(value, data_cfg, tokenizer)
    else:
        try:
            processed = processor.process(row)
        except DataError as exc:
            raise DataError(f"{source} row {index}: {exc}") from None
        text, ids, extra = processed["prompt"], processed["prompt_ids"], {"media": processed.get("media")}
    if len(ids) >= data_cfg.max_len:
        return f"with at least --data.max_len {data_cfg.max_len} tokens", None
    label = row.get(data_cfg.label_key) if data_cfg.label_key else None
    return None, {"prompt": text, "prompt_ids": ids, "label": label, **extra}


def _has_text(value: Any) -> bool:
    if isinstance(value, str):
        return bool(value.strip())
    return any(str(message.get("content") or "").strip() for message in value)


def _row_list(rows: list[int], shown: int = 5) -> str:
    listed = ", ".join(map(str, rows[:shown]))
    more = f" and {len(rows) - shown} more" if len(rows) > shown else ""
    return f"{'row' if len(rows) == 1 else 'rows'} {listed}{more}"


class PromptSchedule:
    """Prompts in a seeded shuffle per episode; the position is checkpointable.

    :meth:`next_batch` hands out ``--rollout.batch_size`` prompts (an episode's last partial
    batch is dropped); :meth:`take` hands out single replacements (dynamic filtering refills),
    crossing into the next episode when one ends.
    """

    def __init__(self, prompts: list[dict[str, Any]], batch_size: int, num_episodes: int, seed: int) -> None:
        if len(prompts) < batch_size:
            raise DataError(f"the prompt dataset has {len(prompts)} rows, fewer than --rollout.batch_size {batch_size}")
        self.prompts, self.batch_size, self.num_episodes, self.seed = prompts, batch_size, num_episodes, seed
        self.batches_per_episode = len(prompts) // batch_size
        self.episode, self.position = 0, 0
        self._shuffled: tuple[int, list[int]] = (-1, [])  # (episode, its order)

    @property
    def total_batches(self) -> int:
        return self.batches_per_episode * self.num_episodes

    def state(self) -> dict[str, int]:
        return {"episode": self.episode, "position": self.position}

    def restore(self, state: dict[str, int]) -> None:
        self.episode, self.position = state["episode"], state["position"]

    def _order(self) -> list[int]:
        """This episode's seeded permutation, shuffled once per episode (not once per batch)."""
        if self._shuffled[0] != self.episode:
            order = list(range(len(self.prompts)))
            random.Random(self.seed * 1000 + self.episode).shuffle(order)
            self._shuffled = (self.episode, order)
        return self._shuffled[1]

    def next_batch(self) -> list[dict[str, Any]] | None:
        if self.position + self.batch_size > len(self.prompts):
            self.episode, self.position = self.episode + 1, 0
        if self.episode >= self.num_episodes:
            return None
        chosen = self._order()[self.position : self.position + self.batch_size]
        self.position += self.batch_size
        return self._handed_out(chosen, self.position - len(chosen))

    def take(self, count: int) -> list[dict[str, Any]]:
        """Up to ``count`` more prompts; fewer (or none) once the last episode is used up."""
        out: list[dict[str, Any]] = []
        while len(out) < count and self.episode < self.num_episodes:
            if self.position >= len(self.prompts):
                self.episode, self.position = self.episode + 1, 0
                continue
            order = self._order()
            chosen = order[self.position : self.position + count - len(out)]
            out += self._handed_out(chosen, self.position)
            self.position += len(chosen)
        return out

    def _handed_out(self, chosen: list[int], first_position: int) -> list[dict[str, Any]]:
        """The prompts at ``chosen`` (this episode's order from ``first_position`` on), each with its
        ``data_state``: the schedule's position just after it, where a resume must start so that this
        prompt and every one before it are not handed out again (async mode checkpoints it)."""
        return [{**self.prompts[i], "data_state": {"episode": self.episode, "position": first_position + k + 1}}
                for k, i in enumerate(chosen)]


def prompt_processor(config: Any, registry: Any) -> Any:
    """The :class:`rlhf.components.Processor` of the model plugins this run switched on (a VLM's), or None:
    a plugin that registered both a model loader and a processor under one name provides it."""
    from rlhf.components import build
    from rlhf.engines.model_extensions import flagged_fields
    from rlhf.registry import ComponentKind

    for _dotted, plugin, changed in flagged_fields(config):
        if changed and plugin in registry.names(ComponentKind.PROCESSOR):
            return build(registry.get(ComponentKind.PROCESSOR, plugin), config)
    return None
