"""``rlhf demo``: the command's flags, and the run (build, SFT, GRPO, report)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar


class DemoCommand:
    """Tiny end-to-end demo on CPU: SFT then GRPO on two-digit addition (~2 min)."""

    help: ClassVar[str] = "tiny end-to-end demo on CPU: SFT then GRPO on 2-digit addition (~2 min)"

    @classmethod
    def add_arguments(cls, parser: Any) -> None:
        parser.add_argument("--run-dir", default="runs/demo", help="where models, metrics and the reward curve go")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--rl-steps", type=int, default=500, help="GRPO steps (32 prompts x 8 samples each)")
        parser.add_argument("--engine", choices=("vllm", "hf"), default="vllm", help="rollout engine")
        parser.add_argument("--sft-target", type=float, default=0.3, help="stop SFT at this held-out greedy accuracy")
        parser.add_argument("--rewards", choices=("exact", "math+format"), default="exact",
                            help="exact-match reward file, or the math and format packs composed")

    def run(self, host: Any, args: Any) -> int:
        from rlhf.launch import attach_run_log
        from rlhf_plugin_demo.run import plot_rewards, report, run_demo

        run_dir = Path(args.run_dir) / f"seed{args.seed}"
        attach_run_log(run_dir)
        result = run_demo(run_dir, seed=args.seed, rl_steps=args.rl_steps, engine=args.engine,
                          sft_target=args.sft_target, plugins=host, rewards=args.rewards)
        plot_rewards(run_dir, run_dir / "reward_curve.png")
        report(result)
        return 0
