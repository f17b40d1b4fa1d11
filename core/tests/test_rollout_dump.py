"""``--rollout.dump_dir``: a step's file is whole or absent, even when its writer is killed, and a resumed run owns
every step after its checkpoint."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

from rlhf.records.rollouts import RolloutDump, dumped_steps, shown_samples

#: a writer that dumps one large step after another until it is killed (256 samples of 128 tokens, as a 32x8x128 step)
WRITER = """
import sys
from rlhf.records.rollouts import RolloutDump

dump = RolloutDump(sys.argv[1])
samples = [{"step": 0, "sample_id": i, "response_ids": list(range(128)), "rollout_logprobs": [-0.5] * 128,
            "response": "x" * 512} for i in range(256)]
step = 0
while True:
    step += 1
    dump.write(step, [{**s, "step": step} for s in samples])
"""


def test_a_writer_killed_mid_step_leaves_whole_files_and_a_resume_drops_the_later_ones(tmp_path: Path) -> None:
    dump = tmp_path / "rollouts"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(dump)])
    try:
        deadline = time.monotonic() + 60
        while len(dumped_steps(dump)) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(random.uniform(0, 0.05))  # somewhere inside a step's write
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
    steps = dumped_steps(dump)
    assert steps == list(range(1, len(steps) + 1)) and len(steps) >= 3
    for step in steps:  # every file under its final name reads whole (Parquet's own reader: the writer's rows hold
        # only the columns this test needs, where read_step also asks for a real dump's)
        samples = pq.read_table(dump / f"step_{step:08d}.parquet").to_pylist()
        assert len(samples) == 256 and {s["step"] for s in samples} == {step}

    RolloutDump(dump, initial_step=2)  # the run resumes from step 2's checkpoint
    assert dumped_steps(dump) == [1, 2]
    # nothing else is left: the killed writer's staging folder goes too
    assert sorted(p.name for p in dump.iterdir()) == ["step_00000001.parquet", "step_00000002.parquet"]


def test_shown_samples_spread_over_the_batch() -> None:
    samples = [{"sample_id": i} for i in range(16)]
    assert [s["sample_id"] for s in shown_samples(samples, 4)] == [0, 4, 8, 12]
    assert shown_samples(samples, 0) == [] and len(shown_samples(samples, 40)) == 16
