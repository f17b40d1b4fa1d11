"""A process that trains on the CPU keeps what it frees, so a step does not fault its tensors' pages in again."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

#: Eight "steps", each allocating and freeing blocks of 40, 64 and 48 MiB (above glibc's largest mmap threshold,
#: as a large batch's activations are), under glibc's defaults or after keep_freed_memory ("kept"); prints the
#: minor page faults of the last four steps, and the resident memory that give_back_memory returns.
PROBE = """
import json, os, resource, sys, torch
from rlhf.runtime.cluster.host_memory import give_back_memory, keep_freed_memory

def step():
    blocks = [torch.ones(mib * 2**18) for mib in (40, 64, 48)]  # float32: every page written
    del blocks

def resident():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

kept = keep_freed_memory() if sys.argv[1] == "kept" else False
for _ in range(4):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(4):
    step()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
held = resident()
give_back_memory()
print(json.dumps({"kept": kept, "faults": faults, "given_back": held - resident()}))
"""


def probe(mode: str, **env: str) -> dict:
    done = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, timeout=120,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt, and /proc for the resident memory")
def test_freed_host_memory_is_reused_without_page_faults_and_given_back_at_the_end() -> None:
    pages_per_step = (40 + 64 + 48) * 2**20 // 4096
    defaults, kept = probe("defaults"), probe("kept")
    assert defaults["kept"] is False and kept["kept"] is True
    # glibc maps each block afresh and unmaps it on free: every page faults again, every step
    assert defaults["faults"] >= 4 * pages_per_step * 0.9, defaults
    # kept: after the first steps the heap's freed blocks serve most of the next ones (glibc's heap still grows now
    # and then, where a freed block is split by a small allocation; 7-19x fewer faults in ten tries)
    assert kept["faults"] <= defaults["faults"] / 4, (kept, defaults)
    # and give_back_memory trims what the heap kept (at least the largest block) back to the system
    assert kept["given_back"] >= 64 * 2**20, kept


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_rlhf_keep_freed_memory_0_keeps_glibcs_defaults() -> None:
    """benchmarks/memory_scaling.py measures a step's own peak with the setting off: every block is mapped afresh."""
    pages_per_step = (40 + 64 + 48) * 2**20 // 4096
    off = probe("kept", RLHF_KEEP_FREED_MEMORY="0")
    assert off["kept"] is False and off["faults"] >= 4 * pages_per_step * 0.9, off
