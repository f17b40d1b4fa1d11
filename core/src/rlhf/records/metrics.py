"""Where metrics go: a progress bar and ``metrics.jsonl`` in the run dir (rlhf-plugin-trackers adds TensorBoard and wandb).

A run that starts at step S (S > 0 after ``--ckpt.load_enable``) owns every record after S:
``metrics.jsonl`` keeps only the records up to S,
so a crash and a resume never leave a step twice.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlhf.errors import StorageError, storage_error
from rlhf.records.checkpoints import write_text_atomically

if TYPE_CHECKING:
    from rlhf.config.run import RunConfig

SHOWN = ("reward", "kl", "response_length", "timing/step_total")

log = logging.getLogger("rlhf.tracking")

#: The plugin API (docs/plugin-api.md); the module's other names may change in any release.
__all__ = ["MetricsTracker"]


class MetricsTracker:
    def __init__(self, config: RunConfig, run_dir: Path, total_steps: int, initial_step: int = 0, *, desc: str = "rl steps",
                 shown: tuple[str, ...] = SHOWN) -> None:
        self.config = config
        self.every = max(1, config.logger.logging_steps)
        self.shown = shown
        self.path = run_dir / "metrics.jsonl"
        _keep_records_up_to(self.path, initial_step)
        self.bar = progress_bar(total_steps, initial_step, desc)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        # drawn by update(), at most once per refresh interval
        self.bar.set_postfix({k.split("/")[-1]: f"{metrics[k]:.3g}" for k in self.shown if k in metrics}, refresh=False)
        self.bar.update(1)
        if step % self.every:
            return
        complete = self.path.stat().st_size if self.path.exists() else 0
        try:
            with self.path.open("a") as handle:
                handle.write(json.dumps({"step": step, **metrics}) + "\n")
        except OSError as exc:
            if self.path.exists():
                os.truncate(self.path, complete)  # no torn record: the file ends with the last whole one
            raise storage_error(self.path, exc, "metrics") from exc

    def note(self, message: str) -> None:
        """One console line above the progress bar (e.g. a steering plugin's effect)."""
        self.bar.write(message)

    def close(self) -> None:
        self.bar.close()


def progress_bar(total: int, initial: int, desc: str) -> Any:
    """A tqdm bar on stderr. In a terminal it redraws in place; in a file or a pipe (CI, SLURM, nohup) it
    writes one plain line at most every ``RLHF_PROGRESS_INTERVAL_S`` seconds (30) and when it closes.
    ``RLHF_NO_PROGRESS=1``: none."""
    import sys

    from tqdm import tqdm

    class PlainLines(tqdm):
        def display(self, msg: str | None = None, pos: int | None = None) -> bool:  # tqdm's override point
            self.fp.write(f"{msg or self}\n")
            self.fp.flush()
            return True

        def close(self) -> None:
            if not self.disable:  # the last line, whole; tqdm's own close would end it with "\r" or an empty line
                if self.last_print_n != self.n:
                    self.display()
                self._decr_instances(self)
                self.disable = True

    disable = os.environ.get("RLHF_NO_PROGRESS") == "1"
    if sys.stderr.isatty():
        return tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True, disable=disable)
    interval = float(os.environ.get("RLHF_PROGRESS_INTERVAL_S", "30"))
    return PlainLines(total=total, initial=initial, desc=desc, mininterval=interval, disable=disable,
                      bar_format="{desc}: {n_fmt}/{total_fmt} ({percentage:.0f} %) [{elapsed}<{remaining}, {rate_fmt}{postfix}]")


def _keep_records_up_to(path: Path, step: int) -> None:
    """Drop the records after ``step`` from ``path``: written to a new file, renamed over the old one."""
    if not path.exists():
        return
    lines = path.read_text().splitlines(keepends=True)
    kept = [line for line in lines if (recorded := _step_of(line)) is not None and recorded <= step]
    if len(kept) == len(lines):
        return
    log.warning("%s: dropped %d record(s) after step %d, where this run starts", path, len(lines) - len(kept), step)
    write_text_atomically(path, "".join(kept), "metrics")


def _step_of(line: str) -> int | None:
    """The step of one ``metrics.jsonl`` record; None for a line torn by a crash mid-write."""
    try:
        return int(json.loads(line)["step"])
    except (ValueError, KeyError, TypeError):
        return None


def read_metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def record_status(run_dir: Path, status: dict[str, Any]) -> None:
    """``run_dir/run_status.json``: how the run ended (status, a steering plugin's reason, the step). A
    failure to write it after a failed run is a warning, so that it does not hide what ended the run."""
    try:
        write_text_atomically(run_dir / "run_status.json", json.dumps(status) + "\n", "run status")
    except StorageError as exc:
        if status["status"] in ("completed", "stopped"):
            raise
        log.warning("%s", exc)
