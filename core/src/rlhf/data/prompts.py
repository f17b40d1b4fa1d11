"""Prompt datasets for RL: local json/jsonl/parquet files or saved dataset dirs, via ``datasets``.

Each row becomes ``{"prompt": str, "prompt_ids": list[int], "label": Any, "prompt_source": int}``
(``prompt_source``: the index of its ``--data.prompt_dataset`` source). The order is a seeded
shuffle per episode, so a resumed run continues with exactly the batches an uninterrupted run
would have seen. Once a steering plugin sets the sources' weights, each batch is drawn by them
instead (still seeded by its position, so a resume draws the same).
"""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING, Any

from rlhf.components import build
from rlhf.config.base import flagged_fields
from rlhf.data.sources import load_mixed, row_value, text_value
from rlhf.data.templates import as_messages, format_prompt
from rlhf.data.workers import chunks, computed_in_order
from rlhf.errors import DataError
from rlhf.registry import ComponentKind

if TYPE_CHECKING:
    from rlhf.config.ppo import PPOConfig

log = logging.getLogger("rlhf.data")


def load_prompt_rows(data_cfg: Any, seed: int) -> list[dict[str, Any]]:
    """Load, mix (``--data.prompt_probs``) and truncate (``--data.max_samples``) the prompt datasets."""
    return load_mixed(data_cfg.prompt_dataset, data_cfg.prompt_probs, data_cfg.prompt_split, data_cfg.max_samples, seed,
                      "--data.prompt_dataset", "--data.prompt_probs", source_column=SOURCE_COLUMN)


#: The column :func:`load_prompt_rows` adds: the row's source index in ``--data.prompt_dataset``.
SOURCE_COLUMN = "_rlhf_prompt_source"


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

    def prepare(part: list[tuple[int, dict[str, Any]]]) -> list[tuple[str | None, dict[str, Any] | None]]:
        return [prepare_prompt(index, row, data_cfg, tokenizer, source, processor) for index, row in part]

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


def prepare_prompt(index: int, row: dict[str, Any], data_cfg: Any, tokenizer: Any, source: str,
             processor: Any) -> tuple[str | None, Any]:
    """``(None, prompt)`` for a usable row, ``(why, None)`` for an invalid one; a missing key raises."""
    row = dict(row)
    source_index = row.pop(SOURCE_COLUMN, 0)  # ours, not the user's: kept out of messages and processors
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
    # the row's other fields (a task's difficulty, its tests, its metadata) reach the rewards and environments as is
    fields = {key: value for key, value in row.items() if key not in (data_cfg.input_key, data_cfg.label_key)}
    if processor is None and data_cfg.apply_chat_template:  # what an environment continues as chat turns
        extra["messages"] = as_messages(value)
    return None, {"prompt": text, "prompt_ids": ids, "label": label, "fields": fields, "prompt_source": source_index,
                  **extra}


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

    With :attr:`weights` set (:meth:`set_weights`, by a steering plugin), the prompts at each
    position are drawn instead: each slot picks a source by weight, then a prompt of that source
    (no repeats within one draw while the source has enough), seeded by (seed, episode, position).
    Episodes keep their length, so the number of steps does not change.
    """

    def __init__(self, prompts: list[dict[str, Any]], batch_size: int, num_episodes: int, seed: int) -> None:
        if len(prompts) < batch_size:
            raise DataError(f"the prompt dataset has {len(prompts)} rows, fewer than --rollout.batch_size {batch_size}")
        self.prompts, self.batch_size, self.num_episodes, self.seed = prompts, batch_size, num_episodes, seed
        self.batches_per_episode = len(prompts) // batch_size
        self.episode, self.position = 0, 0
        self.weights: tuple[float, ...] | None = None
        self.by_source: dict[int, list[int]] = {}
        for index, prompt in enumerate(prompts):
            self.by_source.setdefault(prompt.get("prompt_source", 0), []).append(index)
        self._shuffled: tuple[int, list[int]] = (-1, [])  # (episode, its order)

    @property
    def total_batches(self) -> int:
        return self.batches_per_episode * self.num_episodes

    def set_weights(self, weights: tuple[float, ...]) -> None:
        """Draw the following batches by these per-source weights (one per ``--data.prompt_dataset`` source)."""
        self.weights = tuple(weights)

    def state(self) -> dict[str, Any]:
        return {"episode": self.episode, "position": self.position, **self._weights_state()}

    def restore(self, state: dict[str, Any]) -> None:
        self.episode, self.position = state["episode"], state["position"]
        self.weights = tuple(state["weights"]) if state.get("weights") is not None else None

    def _weights_state(self) -> dict[str, Any]:
        return {} if self.weights is None else {"weights": list(self.weights)}

    def _order(self) -> list[int]:
        """This episode's seeded permutation, shuffled once per episode (not once per batch)."""
        if self._shuffled[0] != self.episode:
            order = list(range(len(self.prompts)))
            random.Random(self.seed * 1000 + self.episode).shuffle(order)
            self._shuffled = (self.episode, order)
        return self._shuffled[1]

    def _chosen(self, position: int, count: int) -> list[int]:
        """The prompt indices for positions ``position …`` (``count`` of them) of this episode."""
        if self.weights is None:
            return self._order()[position : position + count]
        rng = random.Random(f"{self.seed}:{self.episode}:{position}")
        sources = [s for s in sorted(self.by_source) if s < len(self.weights) and self.weights[s] > 0]
        if not sources:  # every weighted source lost all its prompts to filtering
            return self._order()[position : position + count]
        picked = rng.choices(sources, weights=[self.weights[s] for s in sources], k=count)
        chosen: list[int] = []
        for source in sources:
            pool, wanted = self.by_source[source], picked.count(source)
            chosen += rng.sample(pool, wanted) if wanted <= len(pool) else rng.choices(pool, k=wanted)
        rng.shuffle(chosen)
        return chosen

    def next_batch(self) -> list[dict[str, Any]] | None:
        if self.position + self.batch_size > len(self.prompts):
            self.episode, self.position = self.episode + 1, 0
        if self.episode >= self.num_episodes:
            return None
        chosen = self._chosen(self.position, self.batch_size)
        self.position += self.batch_size
        return self._handed_out(chosen, self.position - len(chosen))

    def take(self, count: int) -> list[dict[str, Any]]:
        """Up to ``count`` more prompts; fewer (or none) once the last episode is used up."""
        out: list[dict[str, Any]] = []
        while len(out) < count and self.episode < self.num_episodes:
            if self.position >= len(self.prompts):
                self.episode, self.position = self.episode + 1, 0
                continue
            chosen = self._chosen(self.position, min(count - len(out), len(self.prompts) - self.position))
            out += self._handed_out(chosen, self.position)
            self.position += len(chosen)
        return out

    def observe(self, samples: list[Any]) -> None:
        """Files do not listen to rewards (a :class:`rlhf.data.sourced.SourcedSchedule` hands them to its source)."""

    def _handed_out(self, chosen: list[int], first_position: int) -> list[dict[str, Any]]:
        """The prompts at ``chosen`` (this episode's positions from ``first_position`` on), each with its
        ``data_state``: the schedule's position just after it, where a resume must start so that this
        prompt and every one before it are not handed out again (async mode checkpoints it)."""
        return [{**self.prompts[i], "data_state": {"episode": self.episode, "position": first_position + k + 1,
                                                   **self._weights_state()}}
                for k, i in enumerate(chosen)]


def prompt_processor(config: PPOConfig, registry: Any) -> Any:
    """The :class:`rlhf.components.Processor` named by ``--data.processor``, else the one of the model plugins
    this run switched on (a VLM's), or None: a plugin that registered both a model loader and a processor
    under one name provides it."""

    chosen = getattr(config.data, "processor", None)
    if chosen:
        return build(registry.get(ComponentKind.PROCESSOR, chosen, flag="--data.processor"), config)
    for _dotted, plugin, changed in flagged_fields(config):
        if changed and plugin in registry.names(ComponentKind.PROCESSOR):
            return build(registry.get(ComponentKind.PROCESSOR, plugin), config)
    return None
