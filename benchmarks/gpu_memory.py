"""The GPU's memory while a run goes, read with nvidia-smi: used by ``grpo_step.py --device cuda``.

A run of rlhf may hold the GPU from several processes (Ray's workers, an engine process), TRL and the raw
floor from one; the device's ``memory.used`` counts them all the same way, CUDA contexts and the caching
allocator's reserve included. The peak is taken above what was used before the run started, so a GPU
that something else holds steadily does not count; something else that starts during the run does.
"""

from __future__ import annotations

import os
import subprocess


def _gpu_index() -> str:
    """The GPU the runs use: the first of CUDA_VISIBLE_DEVICES (an index or a UUID), else 0."""
    return os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"


def _query(field: str) -> list[str]:
    done = subprocess.run(["nvidia-smi", f"--query-gpu={field}", "--format=csv,noheader,nounits", "-i", _gpu_index()],
                          capture_output=True, text=True, timeout=30, check=True)
    return [line.strip() for line in done.stdout.splitlines() if line.strip()]


def device_name() -> str:
    """e.g. 'NVIDIA H100 80GB HBM3, 81559 MiB'."""
    name, total = _query("name,memory.total")[0].split(", ")
    return f"{name}, {total} MiB"


class GpuMemory:
    """Samples ``memory.used`` every ``interval_ms`` (nvidia-smi's own loop, -lms) until :meth:`stop`."""

    def __init__(self, interval_ms: int = 200) -> None:
        self.before = int(_query("memory.used")[0])
        self._sampler = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", _gpu_index(),
             "-lms", str(interval_ms)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)

    def stop(self) -> int:
        """Bytes above the memory used before the run, at the run's peak."""
        self._sampler.terminate()
        out, _ = self._sampler.communicate(timeout=30)
        used = [int(line) for line in out.split() if line.isdigit()]
        return max(0, max(used, default=self.before) - self.before) * 2**20


def rank_peaks(folder: str | os.PathLike[str]) -> dict[str, int]:
    """``{"actor rank 0": bytes}``: each model rank's ``torch.cuda.max_memory_allocated()`` as the rank last recorded
    it in ``folder`` (grpo_workloads.py's observer: one ``<role>-<rank>.json`` per rank, rewritten every second)."""
    import json
    from pathlib import Path

    peaks = {}
    for path in sorted(Path(folder).glob("*.json")):
        record = json.loads(path.read_text())
        peaks[f"{record['role']} rank {record['rank']}"] = record["max_memory_allocated"]
    return peaks


def planned_against_measured(plan: dict, peaks: dict[str, int]) -> list[str]:
    """One line per rank: the plan's peak for the GPU that holds it (``rlhf plan --json``'s ``gpus``), the rank's
    measured ``max_memory_allocated``, and the plan's error against it. The plan counts what the GPU holds; the
    measurement counts the rank's tensors only (no CUDA context, no allocator reserve), so the plan should be at or a
    little above it."""
    lines = []
    for label, measured in peaks.items():
        gpu = next((g for g in plan["gpus"] if label in g["holds"]), None)
        if gpu is None:
            lines.append(f"{label}: measured {measured / 2**30:.2f} GiB; the plan places no such rank")
            continue
        error = f"{100 * (gpu['peak'] - measured) / measured:+.0f} %" if measured else "-"
        lines.append(f"{label} (GPU {gpu['node']}.{gpu['gpu']}: {', '.join(gpu['holds'])}): planned "
                     f"{gpu['peak'] / 2**30:.2f} GiB, measured {measured / 2**30:.2f} GiB, plan {error}")
    return lines
