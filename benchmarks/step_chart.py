"""The step-time chart of benchmarks/grpo_step.py: seconds per GRPO step of each system at each shape it ran.

grpo_step.py saves what it measured as JSON (``--results``) and draws it (``--chart``); this module does both, and
redraws a saved file without running anything:

    python benchmarks/step_chart.py benchmarks/results/grpo_step_grid_cpu.json docs/images/grpo_step_time.png

The JSON holds the machine, when, and per shape (prompts x samples x new tokens) each system's median seconds per step
and the 1-minute load its runs saw, so the chart can name both.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path
from typing import Any

#: how the chart names grpo_step.py's systems (benchmarks/grpo_step.py, SYSTEMS); a name not here is shown as it is
LABELS = {
    "rlhf-hf": "rlhf, HF generate in the actor's rank",
    "rlhf-hf-actor": "rlhf, HF engine process",
    "rlhf-vllm": "rlhf, vLLM engine process",
    "rlhf-vllm-inproc": "rlhf, vLLM in the actor's rank",
    "trl": "TRL GRPOTrainer",
    "raw-hf": "raw floor: HF generate + torch update",
    "raw-vllm": "raw floor: vLLM generate + torch update",
}


def cpu_machine() -> str:
    """e.g. '2-core AMD EPYC 7B13': what a CPU figure depends on."""
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor() or platform.machine())
    return f"{os.cpu_count()}-core {model}"


def shape_record(runs: dict[str, list[Any]], *, prompts: int, samples: int, new_tokens: int, responses: str = "early",
                 **_: Any) -> dict:
    """One shape's figures from grpo_step.py's ``measure`` (system -> its runs, each with ``steps``, ``load``,
    ``response_length`` and ``phases``); ``responses``: ``early`` or ``full`` (to the token limit)."""
    def system_record(system_runs: list[Any]) -> dict:
        phases = {k: round(statistics.median(r.phases[k] for r in system_runs), 4) for k in system_runs[0].phases}
        return {"s_per_step": round(statistics.median(t for run in system_runs for t in run.steps), 4),
                "response_length": round(statistics.mean(r.response_length for r in system_runs), 1),
                "phases": phases, "load": [round(run.load, 2) for run in system_runs]}

    return {"prompts": prompts, "samples": samples, "new_tokens": new_tokens, "responses": responses,
            "systems": {system: system_record(system_runs) for system, system_runs in runs.items()}}


def save(shapes: list[dict], machine: str, results: Path | None, chart: Path | None) -> None:
    """Write the results file (beside the chart as .json when only ``chart`` is given) and draw the chart."""
    if results is None and chart is None:
        return
    document = {"machine": machine, "date": time.strftime("%Y-%m-%d"),
                "source": shlex.join(["python", "benchmarks/grpo_step.py", *sys.argv[1:]]), "shapes": shapes}
    results = results or chart.with_suffix(".json")
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(document, indent=1) + "\n")
    print(f"results: {results}")
    if chart is not None:
        draw(document, chart)
        print(f"chart: {chart}")


def load_range(document: dict) -> str:
    """The 1-minute load the runs saw, lowest to highest (a file may state it whole, as ``"load"``)."""
    if "load" in document:
        return document["load"]
    loads = [load for shape in document["shapes"] for figures in shape["systems"].values() for load in figures["load"]]
    low, high = min(loads), max(loads)
    return f"load {low:.1f}" if f"{low:.1f}" == f"{high:.1f}" else f"load {low:.1f}-{high:.1f}"


#: how the chart names the two kinds of shape (a results file from before they were told apart holds early ones)
RESPONSES = {"early": "responses stop early (random model)", "full": "responses reach the token limit"}


def draw(document: dict, out: Path) -> None:
    """Seconds per step (log scale) against the shapes, one line per system, one panel per kind of response length
    (:data:`RESPONSES`); the title names the machine and load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kinds = list(dict.fromkeys(shape.get("responses", "early") for shape in document["shapes"]))
    fig, axes = plt.subplots(1, len(kinds), figsize=(8 * len(kinds), 4.5), squeeze=False)
    for ax, kind in zip(axes[0], kinds):
        shapes = [shape for shape in document["shapes"] if shape.get("responses", "early") == kind]
        names = [f"{s['prompts']}x{s['new_tokens']}" for s in shapes]
        systems = list(dict.fromkeys(system for shape in shapes for system in shape["systems"]))
        for system in systems:
            points = [(i, shape["systems"][system]["s_per_step"]) for i, shape in enumerate(shapes)
                      if system in shape["systems"]]
            style = "--" if system.startswith("raw") else "-"  # the floors dashed, beneath the systems set against them
            ax.plot(*zip(*points), style, marker="o", label=LABELS.get(system, system))
        ax.set_xticks(range(len(shapes)), names)
        ax.set_yscale("log")
        ax.set_xlabel(f"prompts per step x new tokens ({shapes[0]['samples']} samples per prompt)")
        ax.set_ylabel("seconds per GRPO step (median)")
        ax.set_title(RESPONSES.get(kind, kind), fontsize=10)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"GRPO step time: {document['machine']}, {load_range(document)} ({document['date']})", fontsize=10)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="a JSON results file of grpo_step.py (--results or --chart)")
    parser.add_argument("chart", type=Path, help="the PNG to write")
    args = parser.parse_args()
    draw(json.loads(args.results.read_text()), args.chart)


if __name__ == "__main__":
    main()
