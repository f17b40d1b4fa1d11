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
    """``(time.time(), CPU-seconds so far, resident bytes now)`` of the tree, oldest first; beside them, per process,
    its minor page faults and kernel CPU-seconds so far (``/proc/PID/stat``)."""

    times: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    rss: list[int] = field(default_factory=list)
    #: pid -> (its name, ``(time.time(), minor faults so far, system CPU-seconds so far)`` samples, oldest first)
    kernel: dict[int, tuple[str, list[tuple[float, int, float]]]] = field(default_factory=dict)

    def cpu_at(self, when: float) -> float:
        """CPU-seconds the tree had used by ``when`` (linear between samples)."""
        return _at(self.times, self.cpu, when)

    def kernel_work(self, start: float, end: float) -> list[tuple[str, int, float]]:
        """``(name (pid), minor faults, system CPU-seconds)`` of each process between ``start`` and ``end`` (linear
        between samples), the most faults first: the page faults a phase of a step took, and the kernel time they cost."""
        work = []
        for pid, (name, samples) in self.kernel.items():
            times = [t for t, _, _ in samples]
            faults, system = ([sample[i] for sample in samples] for i in (1, 2))
            work.append((f"{name} ({pid})", round(_at(times, faults, end) - _at(times, faults, start)),
                         _at(times, system, end) - _at(times, system, start)))
        return sorted(work, key=lambda row: -row[1])

    def peak_rss(self) -> int:
        return max(self.rss, default=0)


class TreeWatcher:
    """Every ``interval`` seconds on a thread, until :meth:`stop`: :meth:`read` of each live process of the tree
    under ``pid`` (the root and all its descendants, found again at each sweep), then :meth:`swept`.
    A process that ends mid-sweep is skipped; the sweeps end when the root does."""

    def __init__(self, pid: int, interval: float) -> None:
        import psutil

        self.root, self.interval = psutil.Process(pid), interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=type(self).__name__, daemon=True)
        self._thread.start()

    def read(self, process) -> None:
        """Take what this watcher wants from one ``psutil.Process`` (it may raise ``psutil.Error`` or ``OSError``)."""

    def swept(self) -> None:
        """After each sweep over the tree."""

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set():
            try:
                processes = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                break
            for process in processes:
                try:
                    self.read(process)
                except (OSError, psutil.Error):
                    continue
            self.swept()
            self._stop.wait(self.interval)

    def _join(self) -> None:
        self._stop.set()
        self._thread.join()


class TreeSampler(TreeWatcher):
    """CPU-seconds and resident memory of the tree under ``pid``, every ``interval`` seconds, until :meth:`stop`.

    CPU-seconds are the live processes' user + system time plus what their reaped children used;
    a process that ends between two samples loses at most one interval of its time. Memory is the
    sum of the processes' RSS (shared pages counted once per process, as ``ps`` and TRL's own
    figures count them)."""

    def __init__(self, pid: int, interval: float = 0.1) -> None:
        self.samples = TreeSamples()
        self._seen: dict[int, float] = {}  # pid -> its last CPU-seconds, kept after it ends
        self._rss = 0
        super().__init__(pid, interval)

    def read(self, process) -> None:
        with process.oneshot():
            times = process.cpu_times()
            rss = process.memory_info().rss
            name = process.name()
        self._rss += rss
        self._seen[process.pid] = times.user + times.system + times.children_user + times.children_system
        faults = minor_faults(process.pid)
        self.samples.kernel.setdefault(process.pid, (name, []))[1].append((time.time(), faults, times.system))

    def swept(self) -> None:
        self.samples.times.append(time.time())
        self.samples.cpu.append(sum(self._seen.values()))
        self.samples.rss.append(self._rss)
        self._rss = 0

    def stop(self) -> TreeSamples:
        self._join()
        return self.samples


def minor_faults(pid: int) -> int:
    """The minor page faults process ``pid`` has taken so far (field 10 of ``/proc/PID/stat``): a page of memory it
    touched for the first time since the kernel mapped it, e.g. a heap block freed back to the system and taken again."""
    with open(f"/proc/{pid}/stat") as handle:
        fields = handle.read().rsplit(")", 1)[1].split()  # the name, in parentheses, may hold spaces
    return int(fields[7])  # fields[0] is field 3 (the state)


def _at(times: list[float], values: list[float], when: float) -> float:
    """``values`` at ``when``, linear between the samples taken at ``times``, held flat beyond them."""
    i = bisect.bisect_left(times, when)
    if i == 0:
        return values[0]
    if i >= len(times):
        return values[-1]
    t0, t1 = times[i - 1], times[i]
    share = (when - t0) / (t1 - t0) if t1 > t0 else 1.0
    return values[i - 1] + share * (values[i] - values[i - 1])


def load_average() -> float:
    """The machine's 1-minute load average."""
    return os.getloadavg()[0]


def wait_for_quiet(threshold: float, max_wait: float) -> tuple[bool, float]:
    """Wait until the 1-minute load is under ``threshold`` (at most ``max_wait`` seconds); (quiet?, load)."""
    deadline = time.monotonic() + max_wait
    while (load := load_average()) >= threshold and time.monotonic() < deadline:
        time.sleep(5)
    return load < threshold, load
