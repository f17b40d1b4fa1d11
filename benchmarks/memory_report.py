"""What ``memory_scaling.py`` measured, read: the table, whether each process's peak stays flat as the rollout batch
grows, and the chart of peak against prompts per step, planned beside measured.

    python benchmarks/memory_report.py RESULTS.json [CHART.png]     # a saved run again, running nothing
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

MiB = 2**20
PROMPTS = (8, 32, 128)


@dataclass
class Point:
    """One run: its settings and what each model-holding process used (bytes)."""

    engine: str
    backend: str
    prompts: int
    keep: bool
    rank_peak: int = 0  # the actor rank's process at its largest (start-up included)
    rank_step_peaks: list[int] = field(default_factory=list)  # each step's peak, where the rank is the controller's
    rank_rest: list[int] = field(default_factory=list)  # its resident memory at each step's end
    rank_before_model: int = 0  # at rlhf_worker_init: its libraries, before the model
    rank_in_controller: bool = True
    engine_peak: int = 0  # the engine's own process (0: the engine lives in the rank)
    losses: list[float] = field(default_factory=list)  # policy_loss of each step
    metrics: list[dict[str, float]] = field(default_factory=list)  # every numeric metric of each step
    planned_rank: int = 0  # the plan's bytes for the actor's GPU (the engine's too where it lives in the rank)
    planned_engine: int = 0
    stored_rollouts: int = 0  # estimate, in the controller's process
    seconds: float = 0.0
    load: float = 0.0
    error: str = ""

    @property
    def step_above_rest(self) -> int:
        """The rank's last step at its peak above its resident memory as the step before ended: what the step
        itself allocates (generation where the engine is in the rank, the log-prob forwards, the training step).
        Read it with keep_freed_memory off: on, the heap the step reuses is already resident."""
        return self.rank_step_peaks[-1] - self.rank_rest[-2] if len(self.rank_step_peaks) > 1 else 0

    processes: dict[str, int] = field(default_factory=dict)  # every process of the run over 100 MiB: title -> peak


def growth_verdicts(points: list[Point]) -> list[str]:
    """Per engine, backend and setting: the peak at the most prompts against the fewest, allowed to grow by the
    stored rollouts' growth plus 10 % of the smaller peak."""
    lines = []
    key = lambda p: (p.engine, p.backend, p.keep)  # noqa: E731
    for engine, backend, keep in dict.fromkeys(map(key, points)):
        runs = sorted((p for p in points if key(p) == (engine, backend, keep) and not p.error), key=lambda p: p.prompts)
        if len(runs) < 2:
            continue
        low, high = runs[0], runs[-1]
        allowed = high.stored_rollouts - low.stored_rollouts
        for name, a, b in (("rank", low.rank_peak, high.rank_peak), ("engine", low.engine_peak, high.engine_peak)):
            if not a:
                continue
            ok = b - a <= allowed + 0.10 * a
            lines.append(f"{engine} {backend} keep {'on' if keep else 'off'} {name}: {a / MiB:.0f} -> {b / MiB:.0f} MiB "
                         f"({low.prompts} -> {high.prompts} prompts, +{(b - a) / MiB:.0f} MiB; allowed "
                         f"+{(allowed + 0.10 * a) / MiB:.0f}): {'flat' if ok else 'GROWS'}")
    return lines


def table(points: list[Point], baselines: dict[str, int], settings: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    out = Table(title=f"Peak resident memory per process, MiB ({settings['vocab']}-token vocabulary, "
                      f"{settings['samples']} samples, {settings['new_tokens']} new tokens, micro-batches of "
                      f"{settings['micro']}; {settings['machine']})")
    for column in ("engine", "backend", "keep", "prompts", "rank peak", "rank step peaks", "last step above rest",
                   "rank before model",
                   "planned rank", "rank vs plan", "engine peak", "planned engine", "engine vs plan", "stored",
                   "loss", "s", "load"):
        out.add_column(column)
    for p in points:
        if p.error:
            out.add_row(p.engine, p.backend, "on" if p.keep else "off", str(p.prompts), f"failed: {p.error}")
            continue
        above = p.rank_peak - p.rank_before_model
        engine_base = baselines.get(p.engine.split("-")[0], 0)  # "hf" or "vllm"
        out.add_row(p.engine, p.backend, "on" if p.keep else "off", str(p.prompts), f"{p.rank_peak / MiB:.0f}",
                    "/".join(f"{s / MiB:.0f}" for s in p.rank_step_peaks) or "-",
                    f"{p.step_above_rest / MiB:.0f}" if p.step_above_rest else "-", f"{p.rank_before_model / MiB:.0f}",
                    f"{p.planned_rank / MiB:.0f}", f"{above / MiB:.0f} ({error(p.planned_rank, above)})",
                    f"{p.engine_peak / MiB:.0f}" if p.engine_peak else "-",
                    f"{p.planned_engine / MiB:.0f}" if p.engine_peak else "-",
                    f"{(p.engine_peak - engine_base) / MiB:.0f} ({error(p.planned_engine, p.engine_peak - engine_base)})"
                    if p.engine_peak else "-",
                    f"{p.stored_rollouts / MiB:.1f}", "/".join(f"{x:.6f}" for x in p.losses), f"{p.seconds:.0f}",
                    f"{p.load:.1f}")
    Console(width=250).print(out)
    print("rank/engine peak: the process's high-water mark (libraries included); rank step peaks: each step's own "
          "(where the rank is in the controller's process); last step above rest: the last step's peak less the rank's memory as the "
          "step before ended (with keep off: what the step itself needs at its peak); rank vs plan: the peak less the rank's memory before its "
          "model, and the plan's error against it; engine vs plan: the engine process's peak less a bare process with "
          f"its library ({', '.join(f'{k} {v / MiB:.0f} MiB' for k, v in baselines.items())}); stored: the "
          "controller's samples of one batch (estimate); loss: policy_loss per step")


def error(plan: int, measured: int) -> str:
    return f"{100 * (plan - measured) / measured:+.0f} %" if measured > 0 else "-"


def chart(points: list[Point], path: Path, settings: dict, baselines: dict[str, int]) -> None:
    """Peak per process against prompts per step, one panel per backend, planned (dashed) beside measured."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    backends = list(dict.fromkeys(p.backend for p in points if not p.error)) or ["none measured"]
    figure, axes = plt.subplots(1, len(backends), figsize=(8, 4.5), sharey=True, squeeze=False)
    for axis, backend in zip(axes[0], backends):
        for number, engine in enumerate(dict.fromkeys(p.engine for p in points)):
            runs = sorted((p for p in points if (p.engine, p.backend, p.keep) == (engine, backend, True) and not p.error),
                          key=lambda p: p.prompts)
            if not runs:
                continue
            prompts = [p.prompts for p in runs]
            color = f"C{number}"
            # the model-holding processes together: the rank, and the engine's own process where it has one
            axis.plot(prompts, [(p.rank_peak + p.engine_peak) / MiB for p in runs], "o-", color=color, label=engine)
            axis.plot(prompts, [(p.rank_before_model + p.planned_rank + p.planned_engine
                                 + (p.engine_peak and baselines.get(engine.split("-")[0], 0))) / MiB for p in runs], "x--",
                      color=color, alpha=0.6)
        axis.set_xscale("log", base=2)
        axis.set_xticks(list(PROMPTS), [str(p) for p in PROMPTS])
        axis.set_title({"zero3": "DeepSpeed ZeRO-3", "fsdp2": "FSDP2", "zero0": "DeepSpeed ZeRO-0"}.get(backend, backend))
        axis.set_xlabel("prompts per step")
    axes[0][0].set_ylabel("peak resident MiB, rank + engine process")
    axes[0][0].legend(fontsize=8, title="measured (solid), planned (dashed)", title_fontsize=8)
    tree = f", {settings['tree']}" if settings.get("tree") else ""  # which code, where a saved run says
    figure.suptitle(f"GRPO step peak memory, {settings['vocab']}-token vocabulary ({settings['machine']}{tree})",
                    fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def save(path: Path, points: list[Point], baselines: dict[str, int], settings: dict) -> None:
    """``settings``: the model and sizes every point shared (memory_scaling.py's constants)."""
    path.write_text(json.dumps({**settings, "library_baselines": baselines, "points": [asdict(p) for p in points]},
                               indent=1) + "\n")


def load(path: Path) -> tuple[list[Point], dict[str, int], dict]:
    document = json.loads(path.read_text())
    known = {f.name for f in fields(Point)}
    points = [Point(**{k: v for k, v in record.items() if k in known}) for record in document.pop("points")]
    return points, document.pop("library_baselines"), document


def report(points: list[Point], baselines: dict[str, int], settings: dict, chart_path: Path | None = None) -> None:
    table(points, baselines, settings)
    for line in growth_verdicts(points):
        print(line)
    if chart_path:
        chart(points, chart_path, settings, baselines)


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    report(*load(Path(sys.argv[1])), Path(sys.argv[2]) if len(sys.argv) == 3 else None)
