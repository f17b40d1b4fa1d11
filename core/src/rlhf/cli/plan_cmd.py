"""``rlhf plan train NAME [flags]``, and the plan ``rlhf train`` makes first: the trainer's own flags, planned
(:mod:`rlhf.planning`), printed as a table or as JSON; ``--plan.*`` flags describe a cluster on paper."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from rlhf.errors import ConfigError, OneLineArgumentParser
from rlhf.planning.parts import PHASES, format_bytes, parse_bytes
from rlhf.runtime.cluster.capacity import node_gpus
from rlhf.runtime.plan.layout import paper_nodes
from rlhf.runtime.plan.plan import Cluster, Plan, plan_run

PLAN_FLAGS = """\
--plan.gpus N            plan for a cluster of N GPUs (default: the Ray cluster at RAY_ADDRESS, else this machine's,
                         else exactly what the run asks for)
--plan.gpus_per_node K   GPUs per node of that cluster (default 8, or N when N < 8)
--plan.gpu_memory SIZE   memory of one GPU, e.g. 80GiB (default: this machine's GPU; none: memory not checked)
--json                   the plan as JSON"""


#: a GPU driver's device files (NVIDIA, AMD ROCm): without them this machine has no GPU, and torch need not be asked
GPU_DEVICE_FILES = ("/dev/nvidiactl", "/dev/kfd")


def plan_parser(with_json: bool = True) -> argparse.ArgumentParser:
    parser = OneLineArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--plan", dest="plan_only", action="store_true")
    parser.add_argument("--plan.ignore", dest="ignore", action="store_true")
    parser.add_argument("--plan.gpus", dest="gpus", type=int)
    parser.add_argument("--plan.gpus_per_node", dest="per_node", type=int)
    parser.add_argument("--plan.gpu_memory", dest="gpu_memory")
    if with_json:
        parser.add_argument("--json", dest="as_json", action="store_true")
    return parser


def split_plan_args(argv: list[str], with_json: bool = True) -> tuple[argparse.Namespace, list[str]]:
    """The ``--plan*`` flags (and ``--json`` for ``rlhf plan``), and the rest (the trainer's)."""
    return plan_parser(with_json).parse_known_args(argv)


def cluster_of(args: argparse.Namespace, ray_cluster: bool = False) -> Cluster | None:
    """The cluster the flags describe, else (``ray_cluster``) the Ray cluster ``RAY_ADDRESS`` names, with this
    machine's GPU memory, else this machine's GPUs, else None (memory unknown)."""
    memory = None
    if args.gpu_memory:
        try:
            memory = parse_bytes(args.gpu_memory)
        except ValueError as exc:
            raise ConfigError(f"--plan.gpu_memory: {exc}") from None
    if args.gpus is not None:
        if args.gpus < 1 or (args.per_node is not None and args.per_node < 1):
            raise ConfigError("--plan.gpus and --plan.gpus_per_node take a count of at least 1")
        nodes = paper_nodes(args.gpus, args.per_node or min(args.gpus, 8))
        return Cluster(nodes, memory, "--plan.gpus" + (", --plan.gpu_memory" if memory else ""))
    if not (ray_cluster and os.environ.get("RAY_ADDRESS")) and not any(os.path.exists(p) for p in GPU_DEVICE_FILES):
        return Cluster([], memory, "") if memory else None  # no GPU driver here: spare the torch import
    import torch

    local_memory = torch.cuda.get_device_properties(0).total_memory if torch.cuda.is_available() else None
    if ray_cluster and os.environ.get("RAY_ADDRESS"):
        import ray

        ray.init(address=os.environ["RAY_ADDRESS"], logging_level="ERROR", log_to_driver=False)
        try:
            nodes = [n for n in node_gpus() if n]
        finally:
            ray.shutdown()
        return Cluster(nodes, memory or local_memory, "the Ray cluster at RAY_ADDRESS" + (", --plan.gpu_memory" if memory else ""))
    if torch.cuda.is_available():
        return Cluster([float(torch.cuda.device_count())], memory or local_memory, "this machine's GPUs")
    return Cluster([], memory, "") if memory else None


def make_plan(run: Any, host: Any, args: argparse.Namespace, ray_cluster: bool = False) -> Plan:
    cluster = cluster_of(args, ray_cluster)
    if cluster is not None and not cluster.nodes:  # memory given, count not: as many GPUs as the run asks
        sized = plan_run(run.trainer, run.config, host.registry, None, remedies=False).cluster
        cluster = Cluster(sized.nodes, cluster.gpu_memory, "as many GPUs as the run asks for, --plan.gpu_memory")
    return plan_run(run.trainer, run.config, host.registry, cluster)


def plan_json(plan: Plan) -> dict[str, Any]:
    return {
        "cluster": {"nodes": plan.cluster.nodes, "gpu_memory": plan.cluster.gpu_memory, "source": plan.cluster.source},
        "parts": {group: [{"part": p.part, "bytes": p.nbytes, "note": p.note, "away_in": list(p.away_in)} for p in parts]
                  for group, parts in plan.parts.items()},
        "gpus": [{"node": g.node, "gpu": g.index, "holds": [s.label for s in g.seats],
                  **{phase: plan.held(g, phase) for phase in PHASES}, "peak": plan.peak(g)} for g in plan.gpus],
        "fits": plan.fits, "fix": plan.fix, "closest": plan.closest, "verdict": plan.verdict(),
        "placement_problem": plan.placement_problem, "notes": plan.notes,
    }


def print_plan(plan: Plan, title: str) -> None:
    """Placement, memory by part, and the verdict, as rich tables (GPUs that hold the same are one row)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(highlight=False)
    cluster = plan.cluster
    nodes = f"{sum(cluster.nodes):g} GPUs on {len(cluster.nodes)} node(s)"
    memory = format_bytes(cluster.gpu_memory) if cluster.gpu_memory else "unknown memory"
    console.print(f"[bold]{title}[/]: {nodes}, {memory} each ({cluster.source or 'no GPU here'})")
    placement = Table(title="Placement", title_justify="left")
    for column in ("node", "GPUs", "holds"):
        placement.add_column(column)
    for node, gpus, holds in _rows(plan, lambda gpu: tuple(dict.fromkeys(s.group for s in gpu.seats))):
        placement.add_row(str(node), gpus, holds)
    console.print(placement)
    table = Table(title="Memory per GPU", title_justify="left")
    for column in ("holds", "part", "bytes", "away in", "how"):
        table.add_column(column, justify="right" if column == "bytes" else "left")
    for group, parts in plan.parts.items():
        for part in parts:
            table.add_row(group, part.part, format_bytes(part.nbytes), ", ".join(part.away_in), part.note)
    console.print(table)
    totals = Table(title="Total per GPU", title_justify="left")
    for column in ("node", "GPUs", *PHASES, "peak"):
        totals.add_column(column, justify="left" if column in ("node", "GPUs") else "right")
    for node, gpus, phases in _rows(plan, lambda gpu: tuple(plan.held(gpu, phase) for phase in PHASES)):
        totals.add_row(str(node), gpus, *(format_bytes(b) for b in phases), format_bytes(max(phases)))
    console.print(totals)
    for note in plan.notes:
        console.print(f"note: {note}", soft_wrap=True)
    console.print(f"[bold]verdict[/]: {plan.verdict()}", soft_wrap=True)


def _rows(plan: Plan, signature: Any) -> list[tuple[int, str, Any]]:
    """Runs of consecutive GPUs of one node with the same ``signature``: (node, "0-7", signature shown)."""
    rows: list[tuple[int, list[int], Any]] = []
    for gpu in plan.gpus:
        key = signature(gpu)
        if rows and rows[-1][0] == gpu.node and rows[-1][2] == key and rows[-1][1][-1] == gpu.index - 1:
            rows[-1][1].append(gpu.index)
        else:
            rows.append((gpu.node, [gpu.index], key))
    shown = []
    for node, indices, key in rows:
        span = f"{indices[0]}" if len(indices) == 1 else f"{indices[0]}-{indices[-1]}"
        shown.append((node, span, ", ".join(key) if key and isinstance(key[0], str) else key))
    return shown


def run_plan(host: Any, argv: list[str]) -> int:
    """``rlhf plan train NAME …``: 0 when the plan fits (or the memory is unknown), 1 when it does not."""
    from rlhf.launch import trainer_run

    args, rest = split_plan_args(argv)
    if not rest or rest[0] != "train" or len(rest) < 2 or rest[1].startswith("-"):
        print(f"usage: rlhf plan train NAME [the trainer's flags or --config YAML] [plan flags]\n\n{PLAN_FLAGS}")
        return 0 if rest[:1] in (["-h"], ["--help"]) else 2
    run = trainer_run(host, rest[1], rest[2:])
    plan = make_plan(run, host, args, ray_cluster=True)
    if args.as_json:
        print(json.dumps(plan_json(plan), indent=1))
    else:
        print_plan(plan, f"rlhf plan train {rest[1]}")
    return 1 if plan.fits is False else 0


def check_before_run(run: Any, host: Any, args: argparse.Namespace) -> None:
    """``rlhf train`` plans first: a :class:`ConfigError` with the plan's line where the memory does not fit. A machine
    with no GPU (and no --plan.gpu_memory) has no GPU memory to exceed: nothing is refused there. ``--plan.ignore``
    goes ahead anyway."""
    if args.ignore or getattr(run.trainer, "plan_groups", None) is None:
        return
    cluster = cluster_of(args)
    if cluster is None or cluster.gpu_memory is None:
        return
    if not cluster.nodes:
        cluster = Cluster(plan_run(run.trainer, run.config, host.registry, None, remedies=False).cluster.nodes,
                          cluster.gpu_memory, cluster.source)
    plan = plan_run(run.trainer, run.config, host.registry, cluster)
    if plan.placement_problem is None and plan.fits is False:
        raise ConfigError(f"the plan {plan.verdict()} (rlhf plan train … shows it; --plan.ignore runs anyway: the "
                          "estimate's measured error is in docs/plan.md)")
