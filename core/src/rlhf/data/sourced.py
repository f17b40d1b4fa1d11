"""The prompt schedule of a run whose rows a :class:`rlhf.components.PromptSource` makes (``--data.prompt_source``).

It offers what :class:`rlhf.data.prompts.PromptSchedule` offers the controller and the rollout schedulers
(``next_batch``, ``take``, ``total_batches``, ``state``/``restore``, ``observe``), over run-wide positions instead of
a shuffled list: the source makes the rows at positions ``p, p+1, …`` when they are needed, and they are templated
and tokenized then, by the rules a file's rows follow. A checkpoint records the next position and the source's state,
so a resumed run asks the source for the very rows the uninterrupted one would have.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import TYPE_CHECKING, Any

from rlhf.components import PromptOutcome, build
from rlhf.data.prompts import PromptSchedule, build_prompts, load_prompt_rows, prepare_prompt
from rlhf.errors import DataError
from rlhf.registry import ComponentKind, ComponentRegistry

if TYPE_CHECKING:
    from rlhf.config.ppo import PPOConfig

log = logging.getLogger("rlhf.data")


class SourcedSchedule:
    """Rows from ``source`` (registered as ``name``), ``batch_size`` per step, for ``num_episodes`` episodes of the
    source's ``size`` rows (``--data.max_samples`` where it has none, and at most that)."""

    #: a source is one stream: there are no per-source weights to steer (steering's prompt mix sees one source)
    weights: tuple[float, ...] | None = None

    def __init__(self, source: Any, name: str, data_cfg: Any, tokenizer: Any, batch_size: int, num_episodes: int,
                 processor: Any = None) -> None:
        self.source, self.name, self.data_cfg, self.tokenizer, self.processor = source, name, data_cfg, tokenizer, processor
        per_episode = min(getattr(source, "size", None) or data_cfg.max_samples, data_cfg.max_samples)
        if per_episode < batch_size:
            raise DataError(f"--data.prompt_source {name}: {per_episode} rows per episode, fewer than "
                            f"--rollout.batch_size {batch_size}; raise --data.max_samples or the source's size")
        self.batch_size, self.num_episodes = batch_size, num_episodes
        self.batches_per_episode = per_episode // batch_size
        self.batches, self.position = 0, 0  # batches handed out; the next run-wide position to make
        self.pending: dict[int, dict[str, Any]] = {}  # handed-out rows by position, until observed

    @property
    def total_batches(self) -> int:
        return self.batches_per_episode * self.num_episodes

    def set_weights(self, weights: tuple[float, ...]) -> None:
        """One source has nothing to weigh against: a steering plugin's prompt mix is accepted and changes nothing."""

    def state(self) -> dict[str, Any]:
        return {"episode": self.batches // self.batches_per_episode, "batches": self.batches,
                "position": self.position, **self._source_state()}

    def restore(self, state: dict[str, Any]) -> None:
        if "batches" not in state:
            raise DataError(f"--data.prompt_source {self.name}: the checkpoint's prompt position was written by a run "
                            "that read --data.prompt_dataset files; resume it with the same prompt data")
        self.batches, self.position = state["batches"], state["position"]
        if "source" in state and hasattr(self.source, "restore"):
            self.source.restore(state["source"])

    def _source_state(self) -> dict[str, Any]:
        return {"source": self.source.state()} if hasattr(self.source, "state") else {}

    def next_batch(self) -> list[dict[str, Any]] | None:
        if self.batches >= self.total_batches:
            return None
        self.batches += 1
        return self._made(self.batch_size)

    def take(self, count: int) -> list[dict[str, Any]]:
        """``count`` more rows for refills (dynamic filtering): a source does not run out before the run ends."""
        return self._made(count) if count > 0 else []

    def _made(self, count: int) -> list[dict[str, Any]]:
        """``count`` usable prompts from the next positions; rows the data rules refuse are counted and replaced."""
        prompts: list[dict[str, Any]] = []
        refused: Counter[str] = Counter()
        first = self.position
        while len(prompts) < count:
            wanted = count - len(prompts)
            rows = self.source.rows(self.position, wanted)
            if len(rows) != wanted:
                raise DataError(f"--data.prompt_source {self.name}: rows({self.position}, {wanted}) made {len(rows)} "
                                "rows; a source must make exactly the rows it is asked for")
            for row in rows:
                why, prompt = prepare_prompt(self.position, row, self.data_cfg, self.tokenizer, self.name, self.processor)
                self.position += 1
                if why is not None:
                    refused[why] += 1
                    if self.data_cfg.on_invalid_prompt == "error":
                        raise DataError(f"--data.prompt_source {self.name} row {self.position - 1}: invalid prompt "
                                        f"({why}); fix the source or set --data.on_invalid_prompt filter")
                    continue
                self.pending[self.position - 1] = row
                prompts.append({**prompt, "data_state": {**self.state(), "row": self.position - 1}})
            if sum(refused.values()) > 10 * count + 100:
                raise DataError(f"--data.prompt_source {self.name}: {sum(refused.values())} rows in a row were refused "
                                f"({_counted(refused)}); the source makes no usable prompt under these --data flags")
        if refused:
            log.warning("--data.prompt_source %s: skipped %d of the %d rows made at positions %d-%d: %s", self.name,
                        sum(refused.values()), self.position - first, first, self.position - 1, _counted(refused))
        return prompts

    def observe(self, samples: list[Any]) -> None:
        """Hand the source the scores its rows earned (``PromptSource.observe``), in position order."""
        scores: dict[int, list[float]] = {}
        for sample in samples:
            row = (sample.data_state or {}).get("row")
            if row is not None:
                scores.setdefault(row, []).append(float(sample.score))
        outcomes = [PromptOutcome(position, self.pending.pop(position), tuple(scores[position]))
                    for position in sorted(scores) if position in self.pending]
        if outcomes and hasattr(self.source, "observe"):
            self.source.observe(outcomes)


def _counted(reasons: Counter[str]) -> str:
    return "; ".join(f"{count} {why}" for why, count in reasons.items())


def run_schedule(config: PPOConfig, tokenizer: Any, registry: ComponentRegistry,
                 processor: Any) -> tuple[PromptSchedule | SourcedSchedule, tuple[str, ...]]:
    """The run's prompt schedule and the names of its prompt sources (what steering's prompt mix weighs): the
    ``--data.prompt_source`` plugin's rows when one is named, else the ``--data.prompt_dataset`` files'."""
    data, batch_size, episodes, seed = config.data, config.rollout.batch_size, config.train.num_episodes, config.train.seed
    if data.prompt_source:
        if data.prompt_dataset:
            raise DataError("--data.prompt_source and --data.prompt_dataset both name the prompts; keep one")
        source = build(registry.get(ComponentKind.PROMPT_SOURCE, data.prompt_source, flag="--data.prompt_source"), config)
        schedule = SourcedSchedule(source, data.prompt_source, data, tokenizer, batch_size, episodes, processor)
        return schedule, (data.prompt_source,)
    prompts = build_prompts(load_prompt_rows(data, seed), data, tokenizer, data.prompt_dataset,
                            data.dataloader_num_workers, processor)
    names = tuple(s.strip() for s in data.prompt_dataset.split(",") if s.strip())
    return PromptSchedule(prompts, batch_size, episodes, seed), names
