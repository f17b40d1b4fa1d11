"""A process that trains on the CPU keeps what it frees, so a step does not fault its tensors' pages in again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from rlhf_test_support import built_once

#: One process, three phases of eight "steps" each, every step allocating and freeing blocks of 40, 64 and 48 MiB
#: (above glibc's largest mmap threshold, as a large batch's activations are): under glibc's defaults, after
#: keep_freed_memory with RLHF_KEEP_FREED_MEMORY=0 (it must change nothing), and after keep_freed_memory ("kept",
#: last: only give_back_memory undoes it). Each phase prints the minor page faults of its last four steps; "kept" also
#: the resident memory that give_back_memory returns. One interpreter, as torch's import is most of a probe's cost.
PROBE = """
import json, os, resource, torch
from rlhf.runtime.cluster.host_memory import give_back_memory, keep_freed_memory

def step():
    blocks = [torch.ones(mib * 2**18) for mib in (40, 64, 48)]  # float32: every page written
    del blocks

def resident():
    return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

def faults_of_the_last_four_steps():
    for _ in range(4):
        step()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(4):
        step()
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

phases = {"defaults": {"faults": faults_of_the_last_four_steps()}}
os.environ["RLHF_KEEP_FREED_MEMORY"] = "0"
phases["off"] = {"kept": keep_freed_memory()}
phases["off"]["faults"] = faults_of_the_last_four_steps()
del os.environ["RLHF_KEEP_FREED_MEMORY"]
phases["kept"] = {"kept": keep_freed_memory()}
phases["kept"]["faults"] = faults_of_the_last_four_steps()
held = resident()
give_back_memory()
phases["kept"]["given_back"] = held - resident()
print(json.dumps(phases))
"""
PAGES_PER_STEP = (40 + 64 + 48) * 2**20 // 4096


def probe(folder: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "RLHF_KEEP_FREED_MEMORY"}
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    (folder / "phases.json").write_text(done.stdout.splitlines()[-1])


@pytest.fixture(scope="module")
def phases(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The probe's phases, from one run per session (the xdist workers share it)."""
    return json.loads((built_once(tmp_path_factory, "host-memory-probe", probe) / "phases.json").read_text())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt, and /proc for the resident memory")
def test_freed_host_memory_is_reused_without_page_faults_and_given_back_at_the_end(phases) -> None:
    defaults, kept = phases["defaults"], phases["kept"]
    assert kept["kept"] is True
    # glibc maps each block afresh and unmaps it on free: every page faults again, every step
    assert defaults["faults"] >= 4 * PAGES_PER_STEP * 0.9, defaults
    # kept: after the first steps the heap's freed blocks serve most of the next ones (glibc's heap still grows now
    # and then, where a freed block is split by a small allocation; 7-19x fewer faults in ten tries)
    assert kept["faults"] <= defaults["faults"] / 4, (kept, defaults)
    # and give_back_memory trims what the heap kept (at least the largest block) back to the system
    assert kept["given_back"] >= 64 * 2**20, kept


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_rlhf_keep_freed_memory_0_keeps_glibcs_defaults(phases) -> None:
    """benchmarks/memory_scaling.py measures a step's own peak with the setting off: every block is mapped afresh."""
    off = phases["off"]
    assert off["kept"] is False and off["faults"] >= 4 * PAGES_PER_STEP * 0.9, off
