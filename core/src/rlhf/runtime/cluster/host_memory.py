"""How a process that trains on the CPU allocates host memory: freed blocks are kept for the next step.

glibc's ``malloc`` serves every block above its mmap threshold (128 KiB at first, raised towards 32 MiB as large
blocks are freed) with a fresh ``mmap`` and unmaps it on ``free``. A training step on the CPU allocates and frees its
activations and gradients at that size by the thousand, so each step faults every page of them in again: at 128
prompts x 8 samples x 128 tokens on the demo's model, 400-700 thousand minor faults and 0.7-1.2 CPU-seconds in the
kernel per training phase, 10-20 % of its CPU time. How many depends on the process's past (a rank that has just
generated beside its model has raised the threshold; one that waited while an engine process generated has not),
so the same step costs a different amount in different layouts.

:func:`keep_freed_memory` serves every block from the heap and keeps what is freed for reuse, as the CUDA caching
allocator keeps freed device memory: the page faults of a step fall to none after the first. The process's
resident memory then stays at its peak. :func:`give_back_memory` returns what is free to the system and restores
glibc's defaults (a run whose ranks lived in a process that goes on, :func:`rlhf.runtime.cluster.local.in_process_ranks`).

Both do nothing where the C library is not glibc (musl, macOS), which has no such settings, and
``RLHF_KEEP_FREED_MEMORY=0`` keeps glibc's defaults everywhere (a measurement of what a step itself needs at its
peak, benchmarks/memory_scaling.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from typing import Any

# mallopt(3) parameters, from glibc's malloc.h
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
#: glibc's defaults, restored by give_back_memory (the trim threshold's default is its starting value; glibc then
#: adjusts it with the mmap threshold, which setting either parameter stops)
_DEFAULT_TRIM_THRESHOLD = 128 * 1024
_DEFAULT_MMAP_MAX = 65536
#: whether keep_freed_memory's settings are in force in this process
_kept = False


@functools.cache
def _glibc() -> Any:
    """The process's C library where it is glibc (it has ``mallopt`` and ``malloc_trim``), else None."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None
    return libc if hasattr(libc, "mallopt") and hasattr(libc, "malloc_trim") else None


def keep_freed_memory() -> bool:
    """Serve every allocation from the heap (no per-block ``mmap``) and never trim it, in a process that computes
    on the host; True where that took effect. A process that sees a CUDA device keeps glibc's defaults: its steps'
    tensors live in device memory, and what it frees on the host (weights a sleeping engine or an offloading
    backend moved there, a checkpoint it loaded) should go back to the system. ``RLHF_KEEP_FREED_MEMORY=0``: glibc's
    defaults in every process."""
    import torch

    global _kept
    libc = _glibc()
    if libc is None or os.environ.get("RLHF_KEEP_FREED_MEMORY") == "0" or torch.cuda.is_available():
        return False
    _kept = bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
    return _kept


def give_back_memory() -> None:
    """glibc's default thresholds again, and the free part of the heap returned to the system, where
    :func:`keep_freed_memory` took effect in this process; elsewhere nothing, so that glibc keeps adjusting its own
    thresholds (setting them by hand would stop that)."""
    global _kept
    libc = _glibc()
    if libc is None or not _kept:
        return
    _kept = False
    libc.mallopt(_M_MMAP_MAX, _DEFAULT_MMAP_MAX)
    libc.mallopt(_M_TRIM_THRESHOLD, _DEFAULT_TRIM_THRESHOLD)
    libc.malloc_trim(0)
