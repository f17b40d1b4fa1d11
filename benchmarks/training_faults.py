"""The page faults of a GRPO step's training phase, per step, and the rule that fails a run whose steady steps fault
their memory in again (issue 70). Used by ``grpo_step.py``, with the samples of ``process_tree.TreeSampler``.

rlhf's ranks and the raw floor keep the host memory they free (``rlhf.runtime.cluster.host_memory``), so after step 1
a training phase should find its heap resident; TRL keeps glibc's defaults and is not judged.
"""

from __future__ import annotations

from typing import Any


def training_faults(samples: Any, lines: list[dict[str, Any]]) -> list[tuple[int, float, str]]:
    """Per step: the minor faults and system CPU-seconds of the whole tree while the step trained, and the process that
    faulted most. A line is written at the step's end; rlhf's weight sync follows its training phase (the floor's
    line follows its update at once), so the phase is ``[t - sync - train, t - sync]``."""
    out = []
    for line in lines:
        end = line["t"] - line.get("sync", 0.0)
        work = samples.kernel_work(end - line["train"], end)
        out.append((sum(f for _, f, _ in work), sum(k for _, _, k in work), work[0][0] if work else "-"))
    return out


#: a step after the first that faults in more than this share of step 1's training faults fails the benchmark
FAULT_SHARE = 0.10
#: ... and more than this many (20 MiB of 4 KiB pages): a step 1 that faulted little is no yardstick for noise
FAULT_FLOOR = 5000


def fault_regressions(runs: dict[str, list[Any]], warmup: int = 0) -> list[str]:
    """The runs whose steady steps fault their training memory in again (issue 70): rlhf's ranks and the floor keep
    what they free, so after step 1 a training phase finds its heap resident. The ``warmup`` steps after the first
    are not judged, as the table leaves them out of its medians: where blocks that outlive a step split the heap's
    free space, the heap may still grow in them. TRL keeps glibc's defaults: not judged."""
    found = []
    for system, system_runs in runs.items():
        for repeat, run in enumerate(system_runs, 1):
            if system.startswith("trl") or len(run.train_faults) < 2 + warmup:
                continue
            bound = max(FAULT_SHARE * run.train_faults[0], FAULT_FLOOR)
            late = [(step, f) for step, f in enumerate(run.train_faults[1 + warmup:], 2 + warmup) if f > bound]
            if late:
                listed = ", ".join(f"step {step} {f:,} ({run.train_faulters[step - 1]})" for step, f in late)
                found.append(f"{system} repeat {repeat} faulted its training memory in again in a steady step "
                             f"(step 1: {run.train_faults[0]:,} minor faults; bound {bound:,.0f}): {listed}")
    return found
