"""``rlhf rollouts show|summary DIR``: a run's dumped rollouts (``--rollout.dump_dir DIR``) in the terminal."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, ClassVar

#: ``--sort`` keys: the sample column each orders by, largest first
SORT_KEYS = {"reward": "reward", "length": "response_length", "mismatch": "logprob_mismatch"}


class RolloutsCommand:
    """Read what ``--rollout.dump_dir`` wrote: ``show`` a step's samples, or a ``summary`` of every step."""

    help: ClassVar[str] = "show a run's dumped rollouts (--rollout.dump_dir), or summarise them per step"

    @classmethod
    def add_arguments(cls, parser: Any) -> None:
        actions = parser.add_subparsers(dest="rollouts_command", metavar="ACTION", required=True)
        show = actions.add_parser("show", help="one step's samples as a table",
                                  formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        show.add_argument("dir", help="the run's --rollout.dump_dir")
        show.add_argument("--step", type=int, default=None, help="the step to show (default: the last one dumped)")
        show.add_argument("--sort", choices=sorted(SORT_KEYS), default=None, help="order by this, largest first")
        show.add_argument("--grep", default=None, help="only samples whose prompt or response contains this text")
        show.add_argument("--limit", type=int, default=20, help="at most this many samples (0: all)")
        summary = actions.add_parser("summary", help="per step: reward by term, length, cut and repeated responses, "
                                                     "log-prob mismatch", formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        summary.add_argument("dir", help="the run's --rollout.dump_dir")
        summary.add_argument("--chart", default=None, metavar="PNG",
                             help="also draw reward by term over the steps and length against reward into this PNG")

    def run(self, host: Any, args: Any) -> int:
        from rlhf.records.rollouts import dumped_steps

        steps = dumped_steps(args.dir)
        if not steps:
            from rlhf.errors import ConfigError

            raise ConfigError(f"rlhf rollouts {args.rollouts_command} {args.dir}: no step_<N>.parquet file there; give the "
                              "--rollout.dump_dir of a run that has taken a step")
        return _show(args, steps) if args.rollouts_command == "show" else _summary(args, steps)


def _print(table: Any) -> None:
    from rlhf_plugin_rollouts.table import rendered

    print(rendered(table, terminal=sys.stdout.isatty()))


def _show(args: Any, steps: list[int]) -> int:
    from rlhf.records.rollouts import read_step, step_ranges
    from rlhf_plugin_rollouts.table import sample_table

    step = steps[-1] if args.step is None else args.step
    if step not in steps:
        from rlhf.errors import ConfigError

        raise ConfigError(f"rlhf rollouts show --step {step}: {args.dir} holds steps {step_ranges(steps)}; pick one of those")
    samples = read_step(args.dir, step)
    if args.grep:
        samples = [s for s in samples if args.grep in s["prompt"] or args.grep in s["response"]]
    if args.sort:
        key = SORT_KEYS[args.sort]  # samples without the value (no trainer log-probs) go last
        samples.sort(key=lambda s: (s.get(key) is not None, s.get(key) or 0), reverse=True)
    total = len(samples)
    if args.limit > 0:
        samples = samples[: args.limit]
    _print(sample_table(samples, f"{args.dir}: step {step}, {len(samples)} of {total} samples"
                                 f"{f' containing {args.grep!r}' if args.grep else ''}", with_mismatch=True))
    if len(samples) < total:
        print(f"{total - len(samples)} more: --limit 0 shows every one", file=sys.stderr)
    return 0


def _summary(args: Any, steps: list[int]) -> int:
    from rlhf.records.rollouts import read_step
    from rlhf_plugin_rollouts.summary import draw_chart, step_summary, summary_table

    rows, points = {}, []
    for step in steps:
        samples = read_step(args.dir, step)
        rows[step] = step_summary(samples)
        points += [(step, s["response_length"], s["reward"]) for s in samples]
    _print(summary_table(rows))
    if args.chart:
        draw_chart(rows, points, Path(args.chart))
        print(f"chart: {args.chart}")
    return 0
