"""Preempted runs: wasted steps and wall time, periodic checkpoints alone vs preemption checkpoints.

    python benchmarks/preemption.py                          # 24 GRPO steps, 3 preemptions, --ckpt.save_steps 8
    python benchmarks/preemption.py --steps 40 --preemptions 5 --save-steps 10 --seed 1
    python benchmarks/preemption.py --smoke                  # 6 steps, 1 preemption

In the manner of Ray Train's preemption release test. One GRPO run of ``--steps`` steps (the demo's task and
model, untrained, HF engine) is preempted ``--preemptions`` times, each time while a step drawn at random
(seeded, the same steps for both policies, at least 2 apart) is in flight: half a step after the step before it
was logged, a SIGTERM reaches the driver. After each preemption the same command with ``--ckpt.load_enable`` runs again,
until the run has trained every step. Two policies:

* ``periodic``: ``--ckpt.save_steps S`` alone (``--ckpt.preemption_signals ''``): the signal stops the run at
  once and it resumes from the last periodic checkpoint, so the steps trained since are done again;
* ``preemption``: the same periodic checkpoints, plus the default ``--ckpt.preemption_signals`` (SIGTERM):
  the step in flight finishes, is checkpointed, and the resumed run goes on after it.

Wasted steps: steps trained more than once (counted by a plugin's ``rlhf_step_end``), plus one for each step
in flight that a preemption cut short. Wall time: every segment's, start-up included. Prints a table, writes
the figures as JSON (``--json``) and a chart (``--chart``).

A benchmark, not a test: the times depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

STEP_COUNTER = '''
import pathlib
import rlhf
rlhf_plugin_api = rlhf.PLUGIN_API_VERSION

@rlhf.hookimpl
def rlhf_step_end(step, metrics):
    with open(pathlib.Path(__file__).with_suffix(".steps"), "a") as handle:
        handle.write(f"{step}\\n")
'''


def prepare(work: Path, steps: int) -> Path:
    """The demo's tokenizer, an untrained demo model, its prompts and reward file."""
    from rlhf_plugin_demo import task

    model_dir = work / "model"
    if not (model_dir / "config.json").exists():
        tokenizer = task.build_tokenizer(model_dir)
        task.build_model(tokenizer, seed=0).save_pretrained(model_dir)
    train_pairs, _ = task.split_problems(0)
    task.write_prompt_file(work / "prompts.jsonl", train_pairs, 8 * steps, 0)
    (work / "reward.py").write_text(task.REWARD_FILE)
    return model_dir


def trained_steps(counter: Path) -> list[int]:
    return [int(line) for line in counter.read_text().split()] if counter.exists() else []


def run_policy(policy: str, work: Path, model: Path, steps: int, save_steps: int, at: list[int]) -> dict:
    """Train ``steps`` steps under ``policy``, preempted while each step of ``at`` is in flight."""
    from rlhf_plugin_demo.run import rl_arguments

    run_dir = work / policy
    run_dir.mkdir(parents=True, exist_ok=True)
    for name in ("prompts.jsonl", "reward.py"):
        (run_dir / name).write_text((work / name).read_text())
    counter_plugin = run_dir / "step_counter.py"
    counter_plugin.write_text(STEP_COUNTER)
    counter = counter_plugin.with_suffix(".steps")
    flags = [*rl_arguments(run_dir, model, steps, 0, "hf", prompts_per_step=8, samples=4),
             "--data.max_samples", str(8 * steps), "--ckpt.save_steps", str(save_steps), "--ckpt.max_num", "2",
             "--ckpt.load_enable"]
    if policy == "periodic":
        flags += ["--ckpt.preemption_signals", ""]
    command = [sys.executable, "-m", "rlhf", "--plugins", str(counter_plugin), "train", "ppo", *flags]
    started, segments, cut_short, statuses = time.perf_counter(), 0, 0, []
    pending = list(at)
    while True:
        segments += 1
        driver = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                  env={**_env(), "RLHF_NO_PROGRESS": "1"})
        target = pending.pop(0) if pending else None
        if target is not None:  # preempt while step `target` is in flight
            _signal_during(driver, counter, target)
        _, stderr = driver.communicate()
        statuses.append(driver.returncode)
        if target is not None and policy == "periodic":
            cut_short += 1  # the step in flight was lost with the process
        if driver.returncode == 0:
            break
        if driver.returncode not in (75, 128 + signal.SIGTERM):
            raise SystemExit(f"{policy}: the run failed (status {driver.returncode}):\n{stderr[-3000:]}")
    wall = time.perf_counter() - started
    done = trained_steps(counter)
    return {"policy": policy, "segments": segments, "statuses": statuses, "steps_trained": len(done),
            "wasted_steps": len(done) - steps + cut_short, "wall_s": round(wall, 1)}


def _env() -> dict[str, str]:
    import os

    return {**os.environ, "HF_HUB_OFFLINE": "1"}


def _signal_during(driver: subprocess.Popen, counter: Path, step: int) -> None:
    """SIGTERM half a step after step ``step - 1`` was logged (half the last step's time), so that ``step`` is in
    flight."""
    before = len(trained_steps(counter))  # steps of the earlier segments
    logged: list[float] = []  # when each step of this segment was logged
    while driver.poll() is None:
        done = trained_steps(counter)[before:]
        logged += [time.perf_counter()] * (len(done) - len(logged))
        if done and done[-1] >= step - 1:
            gaps = [b - a for a, b in zip(logged, logged[1:])]
            time.sleep(statistics.median(gaps) / 2 if gaps else 0.5)
            if driver.poll() is None:
                driver.send_signal(signal.SIGTERM)
            return
        time.sleep(0.05)


def preempted_steps(steps: int, count: int, seed: int) -> list[int]:
    """``count`` random steps in 2..steps, at least 2 apart: each segment finishes a step before its preemption (a
    signal before a run's first step finished stops it at once by design, writing nothing)."""
    rng = random.Random(seed)
    while True:
        at = sorted(rng.sample(range(2, steps + 1), count))
        if all(b - a >= 2 for a, b in zip(at, at[1:])):
            return at


def chart(results: list[dict], out: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(8, 3.4))
    names = [r["policy"] for r in results]
    for ax, key, label in ((axes[0], "wasted_steps", "wasted steps"), (axes[1], "wall_s", "wall time (s)")):
        bars = ax.bar(names, [r[key] for r in results], color=["#b0b0b0", "#3b7dd8"])
        ax.bar_label(bars)
        ax.set_ylabel(label)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--preemptions", type=int, default=3)
    parser.add_argument("--save-steps", type=int, default=8, help="--ckpt.save_steps of both policies")
    parser.add_argument("--seed", type=int, default=0, help="draws the preempted steps")
    parser.add_argument("--smoke", action="store_true", help="6 steps, 1 preemption, --ckpt.save_steps 4")
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="write the figures here")
    parser.add_argument("--chart", type=Path, default=None, help="write a bar chart (PNG) here")
    args = parser.parse_args()
    steps, preemptions, save_steps = (6, 1, 4) if args.smoke else (args.steps, args.preemptions, args.save_steps)
    at = preempted_steps(steps, preemptions, args.seed)
    work = args.work or Path(tempfile.mkdtemp(prefix="rlhf-preemption-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    model = prepare(work, steps)
    results = [run_policy(policy, work, model, steps, save_steps, at) for policy in ("periodic", "preemption")]
    print(f"{steps} steps, preempted while steps {at} were in flight, --ckpt.save_steps {save_steps}")
    print(f"{'policy':11} {'segments':>8} {'trained':>8} {'wasted steps':>13} {'per preemption':>15} {'wall s':>8}")
    for r in results:
        print(f"{r['policy']:11} {r['segments']:>8} {r['steps_trained']:>8} {r['wasted_steps']:>13} "
              f"{r['wasted_steps'] / max(preemptions, 1):>15.2f} {r['wall_s']:>8.1f}")
    saved = 1 - results[1]["wasted_steps"] / max(results[0]["wasted_steps"], 1)
    print(f"preemption checkpoints saved {100 * saved:.0f} % of the wasted steps")
    record = {"steps": steps, "preempted_at": at, "save_steps": save_steps, "results": results}
    if args.json:
        args.json.write_text(json.dumps(record, indent=1) + "\n")
    if args.chart:
        chart(results, args.chart, f"{steps} GRPO steps, {preemptions} preemptions at steps {at}, --ckpt.save_steps "
              f"{save_steps}")


if __name__ == "__main__":
    main()
