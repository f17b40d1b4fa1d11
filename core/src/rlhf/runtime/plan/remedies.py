"""The first change that makes a plan fit, searched as a user would.

Each candidate is a few flags applied to a copy of the config and planned again (about a millisecond); one the run's
components refuse (their ``check_config``, sleep mode's preconditions) or that sets what is set already is skipped.
Single changes come first, cheapest to the run first (:data:`COSTS`); then pairs of changes to different things, by
their summed cost, made only of single changes that moved the plan at all (a change that leaves the placement and
every part's bytes as they were cannot help a partner); last, more GPUs. Where nothing fits, the plan that came
closest (the fewest bytes over a GPU's memory) is named."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import combinations
from typing import Any

from rlhf.config.checks import engines_colocated_with
from rlhf.config.ppo_rules import check_sleep
from rlhf.config.training_backend import check_backend_config
from rlhf.errors import ConfigError
from rlhf.planning.parts import format_bytes
from rlhf.registry import ComponentKind
from rlhf.runtime.cluster.placement import COLOCATIONS, colocated_sets

#: what a kind of change costs the run, cheapest first: single changes are tried in this order, pairs by the sum
COSTS = {
    "generate in pieces": 0,  # the same samples from more, smaller generate calls and experience forwards
    "share GPUs": 1,  # groups whose phases run one after another anyway take turns on the same GPUs
    "engine": 2,  # generation moved: into the actor's ranks, or to vLLM (a second copy of the weights, a weight sync)
    "recompute": 3,  # gradient checkpointing: about a third more compute in every fit
    "micro-batch": 4,  # the same gradients from more, smaller micro-batches: less efficient kernels
    "ZeRO stage": 5,  # gradients reduce-scattered (2); weights gathered layer by layer in every pass (3)
    "offload": 6,  # the optimizer step on the CPU, its states over PCIe; evaluated weights streamed from the CPU
    "sleep": 7,  # states moved off the GPU and back around every generate phase
}
#: how many times more GPUs for the model groups the last candidates try (singles only: a cluster, not a flag)
GROWTH = (2, 4, 8, 16)
#: --vllm.gpu_memory_utilization the hybrid engine is tried with below the run's own: less KV cache, slower sampling
HYBRID_UTILIZATION = (0.8, 0.6, 0.4)


@dataclass(frozen=True)
class Change:
    """A few flags that change one thing of a run."""

    flags: dict[str, Any]  #: dotted names, as on the command line, and their values
    kind: str  #: a key of :data:`COSTS`
    touches: frozenset[str] = frozenset()  #: what else it sets: two changes that share a kind or a touch never pair

    @property
    def axes(self) -> frozenset[str]:
        return self.touches | {self.kind}

    def typed(self) -> str:
        """``--ds.zero_stage 3 --ds.adam_offload``, as a user types it."""
        def flag(key: str, value: Any) -> str:
            shown = " ".join(map(str, value)) if isinstance(value, list) else str(value)
            return f"--{key}" if value is True else f"--{key} {shown}"

        return " ".join(flag(key, value) for key, value in self.flags.items())


@dataclass
class Outcome:
    """What the search found: the first change that fits, else the closest it came."""

    fix: str | None
    closest: str | None  #: where nothing fits: the change whose fullest GPU is least over, and by how much
    tried: int  #: plans made


def search(config: Any, registry: Any, base: Any, ranks: dict[str, int], engine: type | None,
           replan: Callable[[Any, Any], Any], cluster_for: Callable[[Any], Any]) -> Outcome:
    """The first fitting change for ``config``, whose plan ``base`` does not fit. ``ranks``: role -> ranks of its
    model groups; ``engine``: the run's rollout engine class (None: it generates nothing); ``replan(config,
    cluster)`` plans a changed config; ``cluster_for(config)`` is a cluster of the GPUs it asks for."""
    gpus = int(sum(base.cluster.nodes))
    singles = sorted(candidates(config, registry, ranks, engine, gpus), key=lambda c: COSTS[c.kind])
    seen: dict[str, Any] = {}  # typed change -> its plan (None: refused)

    def attempt(changes: tuple[Change, ...], grows: bool = False) -> Any:
        flags = {key: value for change in changes for key, value in change.flags.items()}
        typed = " ".join(change.typed() for change in changes)
        try:
            changed = changed_config(config, flags)
            check_backend_config(changed, registry)
            if hasattr(changed, "vllm"):  # the rules prepare_config applies, which a plan does not run
                check_sleep(changed)
            on = cluster_for(changed) if grows else base.cluster
            seen[typed] = plan = replan(changed, on)
        except (ConfigError, ValueError):  # refused by a component, or by the config's own validation
            seen[typed] = None
            return None
        return plan

    def fitting(changes: tuple[Change, ...], grows: bool = False) -> str | None:
        plan = attempt(changes, grows)
        if plan is None or plan.fits is False:
            return None
        typed = " ".join(change.typed() for change in changes)
        return typed + (f" ({sum(plan.cluster.nodes):g} GPUs)" if grows else "")

    moved, placing = [], set()
    for change in singles:
        if (fix := fitting((change,))) is not None:
            return Outcome(fix, None, len(seen))
        plan = seen[change.typed()]
        if plan is not None and _footprint(plan) != _footprint(base):
            moved.append(change)
            if plan.placement_problem != base.placement_problem:
                placing.add(change.typed())
    # a run that cannot be placed needs a change to its placement in every pair: one that leaves the placement as it
    # was alone sets none of the flags the placement reads (the groups' nodes, colocation, engines)
    pairs = sorted((pair for pair in combinations(moved, 2) if not pair[0].axes & pair[1].axes
                    and (base.placement_problem is None or {pair[0].typed(), pair[1].typed()} & placing)),
                   key=lambda pair: COSTS[pair[0].kind] + COSTS[pair[1].kind])
    for pair in pairs:
        if (fix := fitting(pair)) is not None:
            return Outcome(fix, None, len(seen))
    for change in growth(config, ranks):
        if (fix := fitting((change,), grows=True)) is not None:
            return Outcome(fix, None, len(seen))
    return Outcome(None, closest(seen), len(seen))


def candidates(config: Any, registry: Any, ranks: dict[str, int], engine: type | None, gpus: int) -> list[Change]:
    """The single changes to try (unordered), each setting something the run does not have already."""
    train = config.train
    found: list[Change] = []
    if engine is not None and hasattr(config, "rollout"):
        found += _generate_changes(config)
    found += [Change({f"train.{name}": True for name in names}, "share GPUs") for names in COLOCATIONS
              if hasattr(train, names[0])]
    if engine is not None and hasattr(train, "colocate") and not engine.in_training_rank \
            and engines_colocated_with(train, ranks) is None:
        found += [Change({"train.colocate": [*train.colocate, f"{role}+engines"]}, "share GPUs") for role in ranks]
    if engine is not None and hasattr(config, "vllm"):
        found += _engine_changes(config, registry, ranks, engine, gpus)
    checkpointed = [f"{role}.gradient_checkpointing_enable" for role in ("actor", "train")
                    if hasattr(getattr(config, role, None), "gradient_checkpointing_enable")]
    found += [Change(dict.fromkeys(checkpointed, True), "recompute")] if checkpointed else []
    found += [Change({"train.micro_batch_size": size}, "micro-batch") for size in _halvings(train.micro_batch_size)]
    found += [Change({"ds.zero_stage": stage}, "ZeRO stage") for stage in (2, 3) if config.ds.zero_stage < stage]
    found.append(Change({"ds.adam_offload": True}, "offload"))
    evaluated = [f"{role}.offload" for role in ("ref", "reward") if role in ranks
                 and hasattr(getattr(config, role, None), "offload")]
    found += [Change(dict.fromkeys(evaluated, True), "offload", frozenset({"evaluated weights"}))] if evaluated else []
    if hasattr(config, "vllm"):
        found.append(Change({"vllm.enable_sleep": True, "ds.enable_sleep": True}, "sleep"))
    return [change for change in found if any(_get(config, key) != value for key, value in change.flags.items())]


def _generate_changes(config: Any) -> list[Change]:
    """Fewer sequences per experience forward (and per HF generate call); in an async run, fewer prompts per
    generate round (a synchronous run hands each engine its whole share of the batch at once, whatever
    ``--rollout.vllm_generate_batch_size`` says)."""
    rollout = config.rollout
    found = [Change({"rollout.micro_batch_size": size}, "generate in pieces", frozenset({"forward batch"}))
             for size in _halvings(rollout.micro_batch_size)]
    if getattr(config.train, "async_enable", False):
        found += [Change({"rollout.vllm_generate_batch_size": size}, "generate in pieces", frozenset({"generate batch"}))
                  for size in _halvings(rollout.vllm_generate_batch_size or rollout.batch_size)]
    return found


def _engine_changes(config: Any, registry: Any, ranks: dict[str, int], engine: type, gpus: int) -> list[Change]:
    """Generation elsewhere: each installed engine that generates inside the actor's ranks; vLLM engines on the GPUs
    the model groups leave free; OpenRLHF's hybrid engine (vLLM on the actor's GPUs, both sides asleep while the other
    works), at the run's ``--vllm.gpu_memory_utilization`` and then at lower ones."""
    vllm, found = config.vllm, []
    for name in registry.names(ComponentKind.ROLLOUT_ENGINE):
        if registry.get(ComponentKind.ROLLOUT_ENGINE, name).in_training_rank:
            found.append(Change({"rollout.engine": name}, "engine"))
    auto = {} if config.rollout.engine == "auto" else {"rollout.engine": "auto"}  # --vllm.num_engines > 0: vLLM
    tp = vllm.tensor_parallel_size
    try:
        model_gpus = sum(ranks[roles[0]] for roles in colocated_sets(config.train, ranks))
    except ConfigError:
        model_gpus = sum(ranks.values())
    if (gpus - model_gpus) // tp >= 1:
        found.append(Change({**auto, "vllm.num_engines": (gpus - model_gpus) // tp}, "engine"))
    hybrid = {**auto, "vllm.num_engines": max(1, ranks.get("actor", 1) // tp), "train.colocate_all": True,
              "vllm.enable_sleep": True}
    sleeps = [{"ds.enable_sleep": True}, {}] if config.ds.zero_stage >= 1 else [{}]  # the backend may refuse it
    for utilization in (vllm.gpu_memory_utilization, *(u for u in HYBRID_UTILIZATION if u < vllm.gpu_memory_utilization)):
        shown = {} if utilization == vllm.gpu_memory_utilization else {"vllm.gpu_memory_utilization": utilization}
        found += [Change({**hybrid, **sleep, **shown}, "engine", frozenset({"share GPUs", "sleep"})) for sleep in sleeps]
    return found


def growth(config: Any, ranks: dict[str, int]) -> list[Change]:
    """Every model group the run has on 2, 4, 8 and 16 times its nodes."""
    roles = [role for role in ranks if hasattr(getattr(config, role, None), "num_nodes")]
    return [Change({f"{role}.num_nodes": getattr(config, role).num_nodes * factor for role in roles}, "more GPUs")
            for factor in GROWTH]


def closest(seen: dict[str, Any]) -> str | None:
    """Of the changes planned, the one whose fullest GPU is least over its memory: ``"FLAGS (node 0 GPU 3 needs
    X of Y)"``; None where none could be placed."""
    placed = [(plan.overshoot(), typed, plan) for typed, plan in seen.items()
              if plan is not None and plan.overshoot() is not None]
    if not placed:
        return None
    _, typed, plan = min(placed, key=lambda entry: entry[0])
    gpu = plan.fullest()
    return (f"{typed} (node {gpu.node} GPU {gpu.index} needs {format_bytes(plan.peak(gpu))} of "
            f"{format_bytes(plan.cluster.gpu_memory)})")


def _footprint(plan: Any) -> tuple[Any, ...]:
    """What a change can move: the placement, every GPU's peak, and every part's bytes (a part of a group that could
    not be placed counts on no GPU, yet a partner change may place it)."""
    parts = tuple((group, part.part, part.nbytes) for group, listed in plan.parts.items() for part in listed)
    return plan.placement_problem, tuple(plan.peak(gpu) for gpu in plan.gpus), parts


def _halvings(size: int) -> list[int]:
    """``size`` halved down to 1: 8 -> [4, 2, 1]."""
    sizes = []
    while size > 1:
        size //= 2
        sizes.append(size)
    return sizes


def changed_config(config: Any, change: dict[str, Any]) -> Any:
    """A validated copy of ``config`` with the dotted ``change`` applied."""
    tree = config.model_dump()
    for key, value in change.items():
        *path, last = key.split(".")
        node = tree
        for part in path:
            node = node[part]
        node[last] = value
    return type(config).model_validate(tree)


def _get(config: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        config = getattr(config, part, None)
    return config
