"""Atomic checkpoints: written into a staging dir, renamed into place, rotated.

Layout of ``<ckpt.path>/global_step<N>/``: ``actor/`` (and ``critic/``) DeepSpeed
states (model, optimizer, scheduler), ``state.json`` (step, data position, KL
coefficient, RNG seeds, the plugin set, plugin states), optional ``hf/`` model.
"""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

PATTERN = re.compile(r"^global_step(\d+)$")


def checkpoints(root: Path) -> list[tuple[int, Path]]:
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := PATTERN.match(p.name)) and (p / "state.json").exists()]
    return sorted(found)


def latest(root: Path) -> tuple[int, Path] | None:
    found = checkpoints(root)
    return found[-1] if found else None


def save(root: Path, step: int, state: dict[str, Any], write: Callable[[Path], None], max_num: int) -> Path:
    """``write(staging_dir)`` fills the checkpoint; it appears under its final name only when complete."""
    staging = stage(root, step)
    write(staging)
    return commit(root, step, state, max_num)


def stage(root: Path, step: int) -> Path:
    """A fresh, empty staging dir for step ``step`` (a leftover of a crashed save is removed)."""
    root.mkdir(parents=True, exist_ok=True)
    staging = root / f".staging-global_step{step}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    return staging


def commit(root: Path, step: int, state: dict[str, Any], max_num: int) -> Path:
    """Write ``state.json`` into the filled staging dir, rename it into place, drop the oldest checkpoints."""
    final = root / f"global_step{step}"
    staging = root / f".staging-global_step{step}"
    (staging / "state.json").write_text(json.dumps(state, indent=1))
    if final.exists():
        shutil.rmtree(final)
    staging.rename(final)
    for _, old in checkpoints(root)[: -max(1, max_num)]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_state(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "state.json").read_text())
