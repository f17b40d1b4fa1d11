"""What ``--rollout.dump_dir`` costs a GRPO step of 32 prompts x 8 samples x 128 new tokens.

    python benchmarks/rollout_dump.py              # 4 steps of the demo's model, HF engine in the actor's rank
    python benchmarks/rollout_dump.py --steps 2 --prompts 8

Two figures:

- in a run: ``timing/samples`` (the step's samples made into records, written to Parquet and handed to the
  ``rlhf_rollout_samples`` observers) against ``timing/step_total`` (generation, experience, training, sync), per
  step, from the run's metrics.jsonl. The model is grpo_step.py's random one that never emits EOS, so every response
  is 128 tokens long;
- alone: the same records made and written for a batch of that size, repeated, without a run around them.

A benchmark, not a test: figures depend on the machine and its load (printed beside them).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from grpo_step import prepare  # beside this script (on sys.path as it runs)
from process_tree import load_average


def in_a_run(work: Path, prompts: int, samples: int, new_tokens: int, steps: int) -> list[dict[str, float]]:
    from rlhf_plugin_demo import task
    from rlhf_plugin_demo.run import rl_arguments

    model = prepare(work, max_positions=new_tokens + 32, warm_start=False, full_length=True)
    run_dir = work / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    task.write_prompt_file(run_dir / "prompts.jsonl", task.split_problems(0)[0], prompts * steps, seed=1)
    (run_dir / "reward.py").write_text(task.REWARD_FILE)
    args = rl_arguments(run_dir, model, steps, 0, "hf", prompts_per_step=prompts, samples=samples,
                        new_tokens=new_tokens, max_len=new_tokens + 16)
    subprocess.run([sys.executable, "-m", "rlhf", "train", "ppo", *args, "--rollout.dump_dir", str(run_dir / "rollouts")],
                   env={**os.environ, "RLHF_NO_PROGRESS": "1"}, check=True, stdout=subprocess.DEVNULL)
    records = [json.loads(line) for line in (run_dir / "rl" / "metrics.jsonl").read_text().splitlines()]
    sizes = {int(p.stem.split("_")[1]): p.stat().st_size for p in (run_dir / "rollouts").glob("step_*.parquet")}
    return [{"step": r["step"], "samples_s": r["timing/samples"], "step_s": r["timing/step_total"],
             "length": r["response_length"], "bytes": sizes[r["step"]]} for r in records]


def alone(work: Path, count: int, new_tokens: int, repeats: int) -> list[float]:
    """Seconds to make ``count`` samples' records and write them, ``repeats`` times."""
    import random

    from rlhf.records.rollouts import RolloutDump
    from rlhf.runtime.control.sample_records import sample_records
    from rlhf.runtime.workers.batch import Sample

    rng = random.Random(0)
    samples = [Sample(prompt_ids=list(range(12)), response_ids=[rng.randrange(16) for _ in range(new_tokens)],
                      rollout_logprobs=[rng.uniform(-3, 0) for _ in range(new_tokens)], prompt="47+85=",
                      response="x" * new_tokens, label="132", group=i // 8, reward=float(i % 2),
                      terms={"reward_func_file": float(i % 2)}) for i in range(count)]
    rows = [[rng.gauss(0, 1)] * new_tokens for _ in range(count)]
    dump = RolloutDump(work / "alone")
    times = []
    for step in range(1, repeats + 1):
        start = time.perf_counter()
        dump.write(step, sample_records(samples, step, rows, rows, None))
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new_tokens", type=int, default=128)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--work", type=Path, default=None, help="where the model and the run go (default: a temp dir)")
    args = parser.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="rollout_dump_"))
    load = load_average()
    steps = in_a_run(work, args.prompts, args.samples, args.new_tokens, args.steps)
    load = max(load, load_average())
    print(f"in a run ({args.prompts} x {args.samples} x {args.new_tokens}; load {load:.1f}):")
    for s in steps:
        print(f"  step {s['step']}: samples {1000 * s['samples_s']:.0f} ms of {s['step_s']:.2f} s "
              f"({100 * s['samples_s'] / (s['step_s'] + s['samples_s']):.2f} %), mean length {s['length']:.0f}, "
              f"file {s['bytes'] / 1024:.0f} KiB")
    later = steps[1:] or steps  # the first step also imports pyarrow
    share = statistics.median(s["samples_s"] / (s["step_s"] + s["samples_s"]) for s in later)
    print(f"  median share after the first step: {100 * share:.2f} %")
    times = alone(work, args.prompts * args.samples, args.new_tokens, repeats=10)
    print(f"alone: {1000 * statistics.median(times[1:]):.0f} ms a step (median of 9; load {load_average():.1f})")


if __name__ == "__main__":
    main()
