"""The best checkpoint by an eval metric (``--ckpt.best_metric_key``), kept apart from the rotation.

After each evaluation whose metric beats every earlier one, the whole checkpoint (DeepSpeed
states, ``state.json``, the HF model with ``--ckpt.save_hf``) is written to
``<ckpt.path>/best/global_step<N>``, replacing the previous best only once it is complete.
``--ckpt.max_num`` and resume look at ``<ckpt.path>/global_step<N>`` only, so the best is
never rotated away nor resumed from by accident. The best value so far travels in every
checkpoint's ``state.json`` (``best_metric``), so a resumed run goes on comparing with it.

It is kept when evaluations run (``--eval.dataset`` and ``--eval.steps``) and checkpoints are on
(``--ckpt.save_steps``) or ``--ckpt.best_metric_key`` is given; ``''`` picks the first pass@
metric (``eval/pass1``), as OpenRLHF auto-detects its ``eval_*_pass1``.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from rlhf.errors import ConfigError

if TYPE_CHECKING:
    from rlhf.config.run import RunConfig

log = logging.getLogger("rlhf.runtime")

#: Where the best checkpoint lives under ``--ckpt.path``.
BEST_DIR = "best"


class BestCheckpoint:
    def __init__(self, key: str, root: Path, enabled: bool) -> None:
        self.key, self.root, self.enabled = key, root / BEST_DIR, enabled
        self.value: float | None = None

    @classmethod
    def from_config(cls, config: RunConfig) -> BestCheckpoint:
        ckpt, evaluation = config.ckpt, config.eval
        evaluating = bool(evaluation.dataset) and evaluation.steps > 0
        return cls(ckpt.best_metric_key, Path(ckpt.path), evaluating and (ckpt.save_steps > 0 or bool(ckpt.best_metric_key)))

    def metric_key(self, metrics: dict[str, float]) -> str:
        """The configured key, or the first pass@ metric; a key the eval does not report is a :class:`ConfigError`."""
        evals = sorted(k for k in metrics if k.startswith("eval/"))
        key = self.key or next((k for k in evals if k.startswith("eval/pass")), "")
        if key not in metrics:
            raise ConfigError(f"--ckpt.best_metric_key {self.key!r}: the evaluation reports no such metric; "
                              f"it reports {', '.join(evals) or 'none'}")
        return key

    def offer(self, step: int, metrics: dict[str, float], save: Callable[..., Path]) -> Path | None:
        """After an evaluation at ``step``: if its metric beats the best so far, ``save(root, keep=1)``
        writes the new best (larger is better) and its path is returned."""
        if not self.enabled:
            return None
        key = self.metric_key(metrics)
        value = float(metrics[key])
        if math.isnan(value) or (self.value is not None and value <= self.value):
            return None
        self.value = value
        path = save(self.root, keep=1)
        log.info("step %d: new best %s = %.4g, saved to %s", step, key, value, path)
        return path
