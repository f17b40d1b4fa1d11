"""Per-step figures of dumped rollouts, and a chart of them.

For each step: the mean reward and each term's, the mean response length, the share of responses cut at the token
limit, the share of responses identical to another of their prompt's group (a collapsing policy repeats itself),
and the mean train/rollout log-prob mismatch (where the step computed trainer log-probs).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from rlhf.records.rollouts import TERM_PREFIX


def step_summary(samples: list[dict[str, Any]]) -> dict[str, float | None]:
    """One step's figures: ``reward``, ``reward/<term>``…, ``length``, ``cut``, ``identical``, ``mismatch``."""
    count = len(samples)
    out: dict[str, float | None] = {"samples": float(count), "reward": _mean(s["reward"] for s in samples)}
    for term in sorted({k for s in samples for k in s if k.startswith(TERM_PREFIX)}):
        out[term] = _mean(s[term] for s in samples if s.get(term) is not None)
    out["length"] = _mean(s["response_length"] for s in samples)
    out["cut"] = sum(s["finish_reason"] == "length" for s in samples) / max(count, 1)
    groups: dict[int, list[str]] = defaultdict(list)
    for s in samples:
        groups[s["group"]].append(s["response"])
    # a response counts as identical when another response of its group has the same text
    repeated = sum(n for responses in groups.values() for n in Counter(responses).values() if n > 1)
    out["identical"] = repeated / max(count, 1)
    mismatches = [s["logprob_mismatch"] for s in samples if s.get("logprob_mismatch") is not None]
    out["mismatch"] = _mean(mismatches) if mismatches else None
    return out


def _mean(values: Any) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


def summary_table(rows: dict[int, dict[str, float | None]]) -> Any:
    """The per-step figures as a ``rich.table.Table``, one row per step."""
    from rich.table import Table

    keys = list(dict.fromkeys(k for row in rows.values() for k in row if k != "samples"))
    table = Table(title="rollouts by step", title_justify="left")
    table.add_column("step", justify="right")
    table.add_column("samples", justify="right")
    for key in keys:
        label = {"cut": "cut %", "identical": "same in group %", "mismatch": "|Δlogp|", "length": "length"}.get(key, key)
        table.add_column(label, justify="right")
    for step, row in rows.items():
        cells = [str(step), f"{row['samples']:.0f}"]
        for key in keys:
            value = row.get(key)
            cells.append("—" if value is None else f"{100 * value:.1f}" if key in ("cut", "identical") else f"{value:.4g}")
        table.add_row(*cells)
    return table


def draw_chart(rows: dict[int, dict[str, float | None]], points: list[tuple[int, float, float]], out: Path) -> None:
    """``out`` (a PNG): each reward term and the total over the steps; every sample's length against its reward
    (``points``: step, length, reward), coloured by step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = list(rows)
    fig, (over_steps, by_length) = plt.subplots(1, 2, figsize=(11, 4))
    for key in ["reward", *sorted({k for row in rows.values() for k in row if k.startswith(TERM_PREFIX)})]:
        values = [rows[s].get(key) for s in steps]
        over_steps.plot(steps, [float("nan") if v is None else v for v in values], marker="o", markersize=3, label=key)
    over_steps.set_xlabel("step")
    over_steps.set_ylabel("mean over the step's samples")
    over_steps.set_title("reward by term")
    over_steps.legend(fontsize="small")
    scatter = by_length.scatter([p[1] for p in points], [p[2] for p in points], c=[p[0] for p in points], s=8, alpha=0.6,
                                cmap="viridis")
    fig.colorbar(scatter, ax=by_length, label="step")
    by_length.set_xlabel("response length (tokens)")
    by_length.set_ylabel("reward")
    by_length.set_title("length against reward")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
