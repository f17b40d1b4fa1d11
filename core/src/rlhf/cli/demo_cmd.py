"""``rlhf demo``: the embedded tiny end-to-end run (SFT, then GRPO through Ray, DeepSpeed and vLLM)."""

from __future__ import annotations

import argparse
from pathlib import Path

from rlhf.host.plugin_host import PluginHost


def add_demo_parser(sub: argparse._SubParsersAction) -> None:
    demo = sub.add_parser("demo", help="tiny end-to-end demo on CPU: SFT then GRPO on 2-digit addition (~2 min)")
    demo.add_argument("--run-dir", default="runs/demo", help="where models, metrics and the reward curve go")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--rl-steps", type=int, default=500, help="GRPO steps (32 prompts x 8 samples each)")
    demo.add_argument("--engine", choices=("vllm", "hf"), default="vllm", help="rollout engine")
    demo.add_argument("--sft-target", type=float, default=0.3, help="stop SFT at this held-out greedy accuracy")
    demo.add_argument("--rewards", choices=("exact", "math+format"), default="exact",
                      help="exact-match reward file, or the math and format packs composed")


def run_demo_command(host: PluginHost, args: argparse.Namespace) -> int:
    from rlhf.console import attach_run_log
    from rlhf.demo.run import plot_rewards, report, run_demo

    run_dir = Path(args.run_dir) / f"seed{args.seed}"
    attach_run_log(run_dir)
    result = run_demo(run_dir, seed=args.seed, rl_steps=args.rl_steps, engine=args.engine,
                      sft_target=args.sft_target, plugins=host, rewards=args.rewards)
    plot_rewards(run_dir, run_dir / "reward_curve.png")
    report(result)
    return 0
