"""What a whole process tree uses while it runs: CPU-seconds and resident memory, sampled from /proc.

A run of rlhf is many processes (the driver, Ray's own, every worker), a run of TRL or of the raw
floor is one; summing over the tree started by one command counts them the same way. The wall
clock moves with the machine's load, CPU-seconds hardly do, so they compare designs even on a busy
machine. Used by ``grpo_step.py``; needs psutil (a Ray dependency).
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from dataclasses import dataclass, field


@dataclass
class TreeSamples:
    """``(time.time(), CPU-seconds so far, resident bytes now)`` of the tree, oldest first."""

    times: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)

    def cpu_at(self, when: float) -> float:
        """CPU-seconds the tree had used by ``when`` (linear between samples)."""
        i = bisect.bisect_left(self.times, when)
        if i == 0:
            return self.cpu[0]
        if i >= len(self.times):
            return self.cpu[-1]
        t0, t1 = self.times[i - 1], self.times[i]
        share = (when - t0) / (t1 - t0) if t1 > t0 else 1.0
        return self.cpu[i - 1] + share * (self.cpu[i] - self.cpu[i - 1])

    def peak_rss(self) -> int:
        return max(self.rss, default=0)


class TreeSampler:
    """Samples the tree under ``pid`` every ``interval`` seconds on a thread, until :meth:`stop`.

    CPU-seconds are the live processes' user + system time plus what their reaped children used;
    a process that ends between two samples loses at most one interval of its time. Memory is the
    sum of the processes' RSS (shared pages counted once per process, as ``ps`` and TRL's own
    figures count them)."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        import psutil

        self.root, self.interval = psutil.Process(pid), interval
        self.samples = TreeSamples()
        self._seen: dict[int, float] = {}  # pid -> its last CPU-seconds, kept after it ends
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            rss = 0
            try:
                processes = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                break
            for process in processes:
                try:
                    with process.oneshot():
                        times = process.cpu_times()
                        rss += process.memory_info().rss
                except psutil.Error:
                    continue
                self._seen[process.pid] = times.user + times.system + times.children_user + times.children_system
            self.samples.times.append(time.time())
            self.samples.cpu.append(sum(self._seen.values()))
            self.samples.rss.append(rss)
            self._stop.wait(self.interval)

    def stop(self) -> TreeSamples:
        self._stop.set()
        self._thread.join()
        return self.samples


def load_average() -> float:
    """The machine's 1-minute load average."""
    return os.getloadavg()[0]


def wait_for_quiet(threshold: float, max_wait: float) -> tuple[bool, float]:
    """Wait until the 1-minute load is under ``threshold`` (at most ``max_wait`` seconds); (quiet?, load)."""
    deadline = time.monotonic() + max_wait
    while (load := load_average()) >= threshold and time.monotonic() < deadline:
        time.sleep(5)
    return load < threshold, load
