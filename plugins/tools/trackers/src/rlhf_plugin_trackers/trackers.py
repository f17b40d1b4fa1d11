"""The trackers a run's logger options ask for, each with ``log(step, metrics)`` and ``close()``."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any


def for_run(config: Any, run_dir: Path) -> list[Any]:
    logger = getattr(config, "logger", None)  # a third-party trainer's config may have no logger section
    if logger is None:
        return []
    every = max(1, logger.logging_steps)
    trackers: list[Any] = []
    if logger.tensorboard_dir:
        trackers.append(TensorBoard(logger.tensorboard_dir, every))
    if logger.wandb.key or os.environ.get("WANDB_MODE"):
        trackers.append(Wandb(config, run_dir, every))
    return trackers


class TensorBoard:
    def __init__(self, directory: str, every: int) -> None:
        self.directory, self.every, self.writer = directory, every, None

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if step % self.every:
            return
        if self.writer is None:
            from torch.utils.tensorboard import SummaryWriter

            # the first step this run logs: a crashed run's events from it on are dropped when TensorBoard reads the dir
            self.writer = SummaryWriter(self.directory, purge_step=step)
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


class Wandb:
    def __init__(self, config: Any, run_dir: Path, every: int) -> None:
        try:
            import wandb
        except ImportError as exc:
            from rlhf.errors import ConfigError

            raise ConfigError("--logger.wandb.* is set but wandb is not installed: pip install wandb") from exc
        wandb_cfg = config.logger.wandb
        if wandb_cfg.key:
            os.environ.setdefault("WANDB_API_KEY", wandb_cfg.key)
        mode = os.environ.get("WANDB_MODE") or ("online" if _reachable("api.wandb.ai") else "offline")
        self.every = every
        self.run = wandb.init(project=wandb_cfg.project, entity=wandb_cfg.org, group=wandb_cfg.group, name=wandb_cfg.run_name,
                              dir=str(run_dir), config=config.model_dump(mode="json"), mode=mode, reinit=True)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        if step % self.every == 0:
            self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


def _reachable(host: str) -> bool:
    """Whether wandb's server answers; without network the run logs offline."""
    try:
        socket.create_connection((host, 443), timeout=3).close()
        return True
    except OSError:
        return False
