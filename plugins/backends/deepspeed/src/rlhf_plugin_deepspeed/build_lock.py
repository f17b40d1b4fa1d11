"""The lock of a DeepSpeed C++ op's JIT build, which a killed process can leave behind.

torch builds an extension under ``$TORCH_EXTENSIONS_DIR/<name>/`` while holding the file ``lock`` there, and
takes it on every load, even when the op is built already. A process killed in that window (Ctrl-C during the
first ``--ds.adam_offload`` run, a job's time limit) leaves the file, and every later run waits on it forever,
printing nothing. A lock older than :data:`STALE_AFTER_S` with no build output written since it was taken
belongs to no running build: it is removed, with a warning.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

log = logging.getLogger(__name__)

#: a build writes an object file within minutes of taking the lock (cpu_adam: ~40 CPU-s per file)
STALE_AFTER_S = 600.0


def clear_stale_build_lock(op: str) -> None:
    """Before DeepSpeed loads (or builds) the C++ op ``op`` (e.g. ``"cpu_adam"``): remove its build lock when no
    build holds it. Called in the process that will load the op, before ``deepspeed.initialize``."""
    from torch.utils.cpp_extension import _get_build_directory

    directory = Path(_get_build_directory(op, verbose=False))
    lock = directory / "lock"
    now = time.time()
    try:
        taken = lock.stat().st_mtime
    except FileNotFoundError:
        return
    written = max((path.stat().st_mtime for path in directory.iterdir() if path.name != "lock"), default=0.0)
    if now - max(written, taken) > STALE_AFTER_S:  # neither taken nor written to for that long
        log.warning("removed %s: a build of DeepSpeed's %s op that is no longer running left it %.0f min ago",
                    lock, op, (now - taken) / 60)
        lock.unlink(missing_ok=True)
    else:
        log.warning("DeepSpeed's %s op is being built by another process (%s exists): waiting for it; if no build is "
                    "running, delete that file", op, lock)
