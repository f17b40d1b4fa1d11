"""Async on vs off on the demo task: reward curves and steady-state seconds per step.

    python benchmarks/async_pipeline.py                  # 30 GRPO steps each, vLLM engine
    python benchmarks/async_pipeline.py --engine hf --steps 20
    python benchmarks/async_pipeline.py --smoke          # 2 steps of 8 prompts each (CI runs this)

Both runs start from the same briefly supervised demo model (2-digit addition, the
demo's flags: 32 prompts (``--prompts``) x 8 samples per step, exact-match reward, group_norm) and
differ only in ``--train.async_enable`` (queue size 1). They run one after the other in this
process, as ``rlhf demo`` runs its GRPO (the figures are step times, so process start-up is not
among them; the first two steps of each run are left out). The learning rate is 5e-4 (``--lr``)
instead of the demo's 1e-4, so both curves move within a few dozen steps. A step's wall time is what the
training loop spends on it: ``timing/step_total`` (sync: generate + reward + experience +
train + weight sync) plus, in async mode, ``async/queue_wait`` (the time it waited for the
producer's next batch; generation itself overlaps the previous step's training). Steady
state is the median over the steps after the first two. Prints a table and writes
``async_reward_curves.png`` to the work directory.

A benchmark, not a test: figures depend on the machine and its load. On a 2-core CPU
machine the engines and the trainer share the same cores, so overlapping them gains little;
on a GPU machine, where the engines and the trainer sit on separate devices, a step costs
about max(generation, training) instead of their sum.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path


def step_seconds(rows: list[dict]) -> list[float]:
    return [r["timing/step_total"] + r.get("async/queue_wait", 0.0) for r in rows]


def prepare(work: Path, smoke: bool) -> Path:
    """The demo's tokenizer and Llama, supervised until 30 % held-out greedy accuracy (up to 5 minutes), so
    that GRPO has a reward to raise within a few dozen steps."""
    from rlhf_plugin_demo import task

    model_dir = work / "model"
    if (model_dir / "config.json").exists():
        return model_dir
    tokenizer = task.build_tokenizer(model_dir)
    model = task.build_model(tokenizer, seed=0)
    if not smoke:
        train_pairs, held_out = task.split_problems(0)
        steps, reached = task.supervised_warm_start(model, tokenizer, train_pairs, held_out, target=0.3, seed=0,
                                                    max_seconds=300)
        print(f"supervised warm start: {steps} steps, held-out greedy accuracy {reached:.2f}")
    model.save_pretrained(model_dir)
    return model_dir


def run(mode: str, work: Path, model: Path, steps: int, prompts: int, engine: str, lr: float) -> list[dict]:
    from rlhf_plugin_demo.run import rl_arguments

    from rlhf.host.plugin_host import PluginHost
    from rlhf.launch import trainer_run
    from rlhf.records.metrics import read_metrics

    run_dir = work / mode
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "prompts.jsonl").write_text((work / "prompts.jsonl").read_text())
    (run_dir / "reward.py").write_text((work / "reward.py").read_text())
    flags = rl_arguments(run_dir, model, steps, 0, engine, prompts_per_step=prompts)
    flags += [*(["--train.async_enable"] if mode == "async" else []), "--data.max_samples", str(prompts * steps),
              "--actor.adam.lr", str(lr)]
    host = PluginHost.load()
    parsed = trainer_run(host, "ppo", flags)
    parsed.trainer(parsed.config, host, parsed.run_dir).run()
    return read_metrics(run_dir / "rl")


def plot(curves: dict[str, list[dict]], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    for mode, rows in curves.items():
        ax.plot([r["step"] for r in rows], [r["reward"] for r in rows], marker=".", label=f"async {mode}")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("mean reward (exact match)")
    ax.set_title("rlhf: async pipeline on vs off, demo task")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, help="GRPO steps per run (default 30; --smoke: 2)")
    parser.add_argument("--prompts", type=int, help="prompts per step, 8 samples each (default 32; --smoke: 8)")
    parser.add_argument("--engine", choices=("vllm", "hf"), default="vllm")
    parser.add_argument("--lr", type=float, default=5e-4, help="actor learning rate (the demo's 1e-4 needs hundreds of steps)")
    parser.add_argument("--smoke", action="store_true", help="the untrained model, 2 steps of 8 prompts each")
    parser.add_argument("--work", type=Path, default=None)
    args = parser.parse_args()
    steps = args.steps or (2 if args.smoke else 30)
    prompts = args.prompts or (8 if args.smoke else 32)
    work = args.work or Path(tempfile.mkdtemp(prefix="rlhf-async-bench-"))
    work.mkdir(parents=True, exist_ok=True)

    from rlhf_plugin_demo import task

    model = prepare(work, args.smoke)
    train_pairs, _ = task.split_problems(0)
    task.write_prompt_file(work / "prompts.jsonl", train_pairs, prompts * steps, 0)
    (work / "reward.py").write_text(task.REWARD_FILE)
    curves = {mode: run(name, work, model, steps, prompts, args.engine, args.lr)
              for mode, name in (("off", "sync"), ("on", "async"))}
    plot(curves, work / "async_reward_curves.png")
    print(f"{'async':6} {'steps':>5} {'s/step (steady)':>16} {'first-5 reward':>15} {'last-5 reward':>14} {'staleness':>10}")
    for mode, rows in curves.items():
        seconds = step_seconds(rows)
        steady = statistics.median(seconds[2:] or seconds)
        rewards = [r["reward"] for r in rows]
        staleness = statistics.mean(r.get("async/staleness", 0.0) for r in rows)
        print(f"{mode:6} {len(rows):>5} {steady:>16.2f} {statistics.mean(rewards[:5]):>15.3f} "
              f"{statistics.mean(rewards[-5:]):>14.3f} {staleness:>10.2f}")
    print(f"reward curves: {work / 'async_reward_curves.png'}")


if __name__ == "__main__":
    main()
