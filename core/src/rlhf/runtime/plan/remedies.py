"""The first change that makes a plan fit, searched as a user would.

The changes come from their owners: the core offers what its own flags change (generating in pieces, sharing GPUs,
an in-rank engine, recomputation, smaller micro-batches, evaluated weights on the CPU, more nodes), the run's training
backend and every installed rollout engine offer theirs (their optional ``plan_remedies``, :mod:`rlhf.planning.remedies`).
Each is applied to a copy of the config and planned again (about a millisecond); one the run's components refuse
(their ``check_config``, sleep mode's preconditions) or that sets what is set already is skipped. Single changes come
first, cheapest to the run first (:data:`rlhf.planning.REMEDY_COSTS`); then pairs of changes to different things, by
their summed cost, made only of single changes that moved the plan at all (a change that leaves the placement and
every part's bytes as they were cannot help a partner); last, more GPUs. Where nothing fits, the plan that came
closest (the fewest bytes over a GPU's memory) is named."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import combinations
from typing import TYPE_CHECKING, Any

from rlhf.config.checks import engines_colocated_with
from rlhf.config.ppo_rules import check_sleep
from rlhf.config.training_backend import backend_class, check_backend_config
from rlhf.errors import ConfigError
from rlhf.planning.parts import format_bytes
from rlhf.planning.remedies import REMEDY_COSTS, Remedy, RemedyContext
from rlhf.registry import ComponentKind, ComponentRegistry
from rlhf.runtime.cluster.placement import COLOCATIONS, colocated_sets
from rlhf.runtime.plan.planned import PlannedConfig

if TYPE_CHECKING:
    from rlhf.runtime.plan.plan import Cluster, Plan

#: how many times more GPUs for the model groups the last candidates try (singles only: a cluster, not a flag)
GROWTH = (2, 4, 8, 16)


@dataclass
class Outcome:
    """What the search found: the first change that fits, else the closest it came."""

    fix: str | None
    closest: str | None  #: where nothing fits: the change whose fullest GPU is least over, and by how much
    tried: int  #: plans made


def search(config: PlannedConfig, registry: ComponentRegistry, base: Plan, ranks: dict[str, int], engine: type | None,
           replan: Callable[[PlannedConfig, Cluster], Plan], cluster_for: Callable[[PlannedConfig], Cluster]) -> Outcome:
    """The first fitting change for ``config``, whose plan ``base`` does not fit. ``ranks``: role -> ranks of its
    model groups; ``engine``: the run's rollout engine class (None: it generates nothing); ``replan(config,
    cluster)`` plans a changed config; ``cluster_for(config)`` is a cluster of the GPUs it asks for."""
    gpus = int(sum(base.cluster.nodes))
    singles = sorted(candidates(config, registry, ranks, engine, gpus), key=lambda c: REMEDY_COSTS[c.kind])
    seen: dict[str, Plan | None] = {}  # typed change -> its plan (None: refused)

    def attempt(changes: tuple[Remedy, ...], grows: bool = False) -> Plan | None:
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

    def fitting(changes: tuple[Remedy, ...], grows: bool = False) -> str | None:
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
                   key=lambda pair: REMEDY_COSTS[pair[0].kind] + REMEDY_COSTS[pair[1].kind])
    for pair in pairs:
        if (fix := fitting(pair)) is not None:
            return Outcome(fix, None, len(seen))
    for change in growth(config, ranks):
        if (fix := fitting((change,), grows=True)) is not None:
            return Outcome(fix, None, len(seen))
    return Outcome(None, closest(seen), len(seen))


def candidates(config: PlannedConfig, registry: ComponentRegistry, ranks: dict[str, int], engine: type | None, gpus: int) -> list[Remedy]:
    """The single changes to try (unordered), each setting something the run does not have already: the core's own,
    the training backend's and, where the run generates, every installed rollout engine's."""
    context = RemedyContext(ranks, gpus, _model_gpus(config, ranks), engine)
    backend = offered(backend_class(config, registry), config, context)
    # a backend's sleep frees room only for engines that sleep beside it: the engines pair it with their own
    context = replace(context, backend_sleep=tuple(r.flags for r in backend if r.kind == "sleep"))
    train = config.train
    found: list[Remedy] = []
    if engine is not None and hasattr(config, "rollout"):
        found += _generate_changes(config)
    found += [Remedy({f"train.{name}": True for name in names}, "share GPUs", "groups take turns on the same GPUs")
              for names in COLOCATIONS if hasattr(train, names[0])]
    if engine is not None and hasattr(train, "colocate") and not engine.in_training_rank \
            and engines_colocated_with(train, ranks) is None:
        found += [Remedy({"train.colocate": [*train.colocate, f"{role}+engines"]}, "share GPUs",
                         f"the engines take turns with the {role} on its GPUs") for role in ranks]
    if engine is not None and hasattr(config, "rollout"):
        found += _engine_changes(config, registry, context)
    checkpointed = [f"{role}.gradient_checkpointing_enable" for role in ("actor", "train")
                    if hasattr(getattr(config, role, None), "gradient_checkpointing_enable")]
    found += [Remedy(dict.fromkeys(checkpointed, True), "recompute", "about a third more compute in every fit",
                     ("activations",))] if checkpointed else []
    found += [Remedy({"train.micro_batch_size": size}, "micro-batch", "the same gradients from smaller micro-batches",
                     ("activations", "logits", "log-prob chunk")) for size in _halvings(train.micro_batch_size)]
    found += [remedy for remedy in backend if remedy.kind != "sleep"]
    evaluated = [f"{role}.offload" for role in ("ref", "reward") if role in ranks
                 and hasattr(getattr(config, role, None), "offload")]
    found += [Remedy(dict.fromkeys(evaluated, True), "offload", "evaluated weights streamed in from the CPU",
                     ("weights",), frozenset({"evaluated weights"}))] if evaluated else []
    unique = {change.typed(): change for change in reversed(found)}  # two offers of one change: the first counts
    return [change for change in found if unique[change.typed()] is change
            and any(_get(config, key) != value for key, value in change.flags.items())]


def offered(component: type, config: PlannedConfig, context: RemedyContext) -> list[Remedy]:
    """A component's ``plan_remedies(config, context)``, if it has one, each of a known kind."""
    plan_remedies = getattr(component, "plan_remedies", None)
    remedies = list(plan_remedies(config, context)) if plan_remedies is not None else []
    for remedy in remedies:
        if remedy.kind not in REMEDY_COSTS:
            raise ConfigError(f"{component.__name__}.plan_remedies offered a change of kind {remedy.kind!r} "
                              f"({remedy.typed()}); kinds are {', '.join(REMEDY_COSTS)} (rlhf.planning.REMEDY_COSTS)")
    return remedies


def _generate_changes(config: PlannedConfig) -> list[Remedy]:
    """Fewer sequences per experience forward (and per HF generate call); in an async run, fewer prompts per
    generate round (a synchronous run hands each engine its whole share of the batch at once, whatever
    ``--rollout.vllm_generate_batch_size`` says)."""
    rollout = config.rollout
    found = [Remedy({"rollout.micro_batch_size": size}, "generate in pieces", "the same samples from smaller calls",
                    ("activations", "logits", "log-prob chunk", "KV cache"), frozenset({"forward batch"}))
             for size in _halvings(rollout.micro_batch_size)]
    if getattr(config.train, "async_enable", False):
        found += [Remedy({"rollout.vllm_generate_batch_size": size}, "generate in pieces",
                         "the same samples from smaller generate rounds", (), frozenset({"generate batch"}))
                  for size in _halvings(rollout.vllm_generate_batch_size or rollout.batch_size)]
    return found


def _engine_changes(config: PlannedConfig, registry: ComponentRegistry, context: RemedyContext) -> list[Remedy]:
    """Generation elsewhere: each installed engine that generates inside the actor's ranks (the core's own
    ``--rollout.engine``), then what every installed engine offers of its own (``plan_remedies``)."""
    kind, classes = ComponentKind.ROLLOUT_ENGINE, []
    found = []
    for name in registry.names(kind):
        classes.append(engine := registry.get(kind, name))
        if engine.in_training_rank:
            found.append(Remedy({"rollout.engine": name}, "engine", "generation inside the actor's ranks, "
                                "with their own weights"))
    return found + [remedy for engine in classes for remedy in offered(engine, config, context)]


def _model_gpus(config: PlannedConfig, ranks: dict[str, int]) -> int:
    """GPUs the model groups take, colocated groups counted once (every group apart where the colocation is bad, or
    where the trainer has no colocation flags: one process per GPU)."""
    if not hasattr(config.train, "colocate_all"):
        return sum(ranks.values())
    try:
        return sum(ranks[roles[0]] for roles in colocated_sets(config.train, ranks))
    except ConfigError:
        return sum(ranks.values())


def growth(config: PlannedConfig, ranks: dict[str, int]) -> list[Remedy]:
    """Every model group the run has on 2, 4, 8 and 16 times its nodes."""
    roles = [role for role in ranks if hasattr(getattr(config, role, None), "num_nodes")]
    return [Remedy({f"{role}.num_nodes": getattr(config, role).num_nodes * factor for role in roles}, "more GPUs",
                   f"{factor} times the GPUs") for factor in GROWTH]


def closest(seen: dict[str, Plan | None]) -> str | None:
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


def _footprint(plan: Plan) -> tuple[Any, ...]:
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


def changed_config(config: PlannedConfig, change: dict[str, Any]) -> PlannedConfig:
    """A validated copy of ``config`` with the dotted ``change`` applied; a key whose first part is no section of the
    config is a plugin's option (``fsdp2.cpu_offload``), kept under ``plugins`` as its flag would be."""
    tree = config.model_dump()
    for key, value in change.items():
        section, *path, last = key.split(".")
        node = tree[section] if section in tree else tree["plugins"].setdefault(section, {})
        for part in path:
            node = node[part]
        node[last] = value
    return type(config).model_validate(tree)


def _get(config: PlannedConfig, dotted: str) -> Any:
    """The value the dotted flag has in ``config`` (a plugin's option under ``plugins``); None where it has none."""
    first, _, rest = dotted.partition(".")
    if not hasattr(config, first) and isinstance(getattr(config, "plugins", None), dict):
        options = config.plugins.get(first, {})
        return options.get(rest) if isinstance(options, dict) else None
    node: Any = config
    for part in dotted.split("."):
        node = getattr(node, part, None)
    return node
