"""The trackers a run's logger options ask for, each with ``log(step, metrics)``, ``samples(step, kind, samples)`` (the
``--logger.samples`` a step shows: TensorBoard text, a wandb Table) and ``close()``."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

from rlhf.records.rollouts import EXTRA_PREFIX, TERM_PREFIX, samples_shown_every, shown_samples

#: the sample columns a tracker shows, besides each reward term and each plugin's column
SAMPLE_COLUMNS = ("group", "prompt", "response", "reward", "advantage", "response_length", "finish_reason")


def for_run(config: Any, run_dir: Path) -> list[Any]:
    logger = getattr(config, "logger", None)  # a third-party trainer's config may have no logger section
    if logger is None:
        return []
    every = max(1, logger.logging_steps)
    shown = (logger.samples, samples_shown_every(logger)) if hasattr(logger, "samples") else (0, 1)
    trackers: list[Any] = []
    if logger.tensorboard_dir:
        trackers.append(TensorBoard(logger.tensorboard_dir, every, shown))
    if logger.wandb.key or os.environ.get("WANDB_MODE"):
        trackers.append(Wandb(config, run_dir, every, shown))
    return trackers


def sample_rows(step: int, kind: str, samples: list[dict[str, Any]],
                shown: tuple[int, int]) -> tuple[list[str], list[list[Any]]] | None:
    """The columns and rows of the samples a step shows (``shown``: how many, every how many steps; an evaluation
    shows its samples whatever its step); None: none."""
    count, every = shown
    shown_now = shown_samples(samples, count)
    if not shown_now or (kind == "train" and step % every):
        return None
    extra = list(dict.fromkeys(k for s in shown_now for k in s if k.startswith((TERM_PREFIX, EXTRA_PREFIX))))
    columns = [*SAMPLE_COLUMNS, *extra]
    return columns, [[s.get(column) for column in columns] for s in shown_now]


class TensorBoard:
    def __init__(self, directory: str, every: int, shown: tuple[int, int] = (0, 1)) -> None:
        self.directory, self.every, self.shown, self.writer = directory, every, shown, None

    def _writer(self, step: int) -> Any:
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            # the first step this run logs: a crashed run's events from it on are dropped when TensorBoard reads the dir
            self.writer = SummaryWriter(self.directory, purge_step=step)
        return self.writer

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if step % self.every:
            return
        writer = self._writer(step)
        for key, value in metrics.items():
            writer.add_scalar(key, value, step)

    def samples(self, step: int, kind: str, samples: list[dict[str, Any]]) -> None:
        """A Markdown table in the Text tab (``samples/train``, ``samples/eval``)."""
        table = sample_rows(step, kind, samples, self.shown)
        if table is None:
            return
        columns, rows = table

        def cell(value: Any) -> str:  # one Markdown cell: no line break, no column bar
            return "" if value is None else str(value).replace("|", "\\|").replace("\n", "⏎")

        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
        self._writer(step).add_text(f"samples/{kind}", "\n".join(lines), step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class Wandb:
    def __init__(self, config: Any, run_dir: Path, every: int, shown: tuple[int, int] = (0, 1)) -> None:
        try:
            import wandb
        except ImportError as exc:
            from rlhf.errors import ConfigError

            raise ConfigError("--logger.wandb.* is set but wandb is not installed: pip install wandb") from exc
        wandb_cfg = config.logger.wandb
        if wandb_cfg.key:
            os.environ.setdefault("WANDB_API_KEY", wandb_cfg.key)
        mode = os.environ.get("WANDB_MODE") or ("online" if _reachable("api.wandb.ai") else "offline")
        self.every, self.shown, self.table = every, shown, wandb.Table
        self.run = wandb.init(project=wandb_cfg.project, entity=wandb_cfg.org, group=wandb_cfg.group, name=wandb_cfg.run_name,
                              dir=str(run_dir), config=config.model_dump(mode="json"), mode=mode, reinit=True)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if step % self.every == 0:
            self.run.log(metrics, step=step)

    def samples(self, step: int, kind: str, samples: list[dict[str, Any]]) -> None:
        """A ``wandb.Table`` under ``samples/train`` or ``samples/eval``, at the step's own record."""
        table = sample_rows(step, kind, samples, self.shown)
        if table is not None:
            columns, rows = table
            self.run.log({f"samples/{kind}": self.table(columns=columns, data=rows)}, step=step, commit=False)

    def close(self) -> None:
        self.run.finish()


def _reachable(host: str) -> bool:
    """Whether wandb's server answers; without network the run logs offline."""
    try:
        socket.create_connection((host, 443), timeout=3).close()
        return True
    except OSError:
        return False
