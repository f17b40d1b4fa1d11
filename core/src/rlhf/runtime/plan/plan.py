"""A run's plan: its seats on each GPU, what each GPU holds by part in each phase, the verdict, and the first
change that fits. The components answer for their parts (:mod:`rlhf.planning.parts`); this module places and adds."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from rlhf import ops
from rlhf.config.training_backend import backend_class
from rlhf.errors import ConfigError
from rlhf.models.extensions import active
from rlhf.planning.groups import ModelGroup, RunGroups
from rlhf.planning.parts import PHASES, MemoryPart, PlannedModel, activation_bytes, dtype_bytes, format_bytes
from rlhf.planning.shapes import model_shape
from rlhf.registry import ComponentKind, ComponentRegistry
from rlhf.runtime.plan.layout import GPU, group_keys, lay_out, paper_nodes, requested_gpus
from rlhf.runtime.plan.planned import PlannedConfig
from rlhf.runtime.plan.remedies import changed_config, search

#: fp32 ``(chunk, V)`` tensors of one log-prob chunk alive at once in rlhf.ops.chunked_logprobs (measured with
#: benchmarks/logprob_memory.py): the temperature-scaled fp32 copy of the chunk, and its exp (the probabilities, or the
#: gradient written from them in a backward); each chunk is freed before the next
CHUNK_COPIES = 2


@dataclass
class Cluster:
    """GPUs per node and the memory of one GPU (None: unknown, the memory is not checked), and where they came from."""

    nodes: list[float]
    gpu_memory: int | None
    source: str

    def name(self) -> str:
        """How a verdict calls it: "the Ray cluster" only where one was read, else "the planned cluster"."""
        return "the Ray cluster" if "Ray cluster" in self.source else "the planned cluster"


@dataclass
class Plan:
    cluster: Cluster
    gpus: list[GPU]
    parts: dict[str, list[MemoryPart]]  #: seat group -> what one GPU of it holds
    placement_problem: str | None
    fix: str | None = None  #: the first change that fits, where the plan does not
    closest: str | None = None  #: where no change tried fits: the one that came closest, and its fullest GPU
    tried: int = 0  #: changes and pairs of changes the search planned
    notes: list[str] = field(default_factory=list)  #: what the plan assumed that the flags do not say

    def held(self, gpu: GPU, phase: str) -> int:
        """Bytes ``gpu`` holds in ``phase`` (parts not estimated count 0)."""
        return sum(part.nbytes or 0 for seat in gpu.seats for part in self.parts[seat.group] if phase not in part.away_in)

    def peak(self, gpu: GPU) -> int:
        return max(self.held(gpu, phase) for phase in PHASES)

    def unestimated(self) -> list[str]:
        return sorted({f"{group} {part.part}" for group, parts in self.parts.items() for part in parts if part.nbytes is None})

    @property
    def fits(self) -> bool | None:
        """False where it cannot be placed or a GPU holds more than it has; None where the memory is unknown."""
        if self.placement_problem:
            return False
        if self.cluster.gpu_memory is None:
            return None
        return all(self.peak(gpu) <= self.cluster.gpu_memory for gpu in self.gpus)

    def fullest(self) -> GPU | None:
        return max(self.gpus, key=self.peak, default=None)

    def overshoot(self) -> int | None:
        """Bytes the fullest GPU holds beyond its memory (negative: room left); None where the run cannot be placed
        or the memory is unknown."""
        gpu = self.fullest()
        if self.placement_problem or gpu is None or self.cluster.gpu_memory is None:
            return None
        return self.peak(gpu) - self.cluster.gpu_memory

    def verdict(self) -> str:
        """One line: what fits or does not, and the first change that fits."""
        gpu, memory = self.fullest(), self.cluster.gpu_memory
        if self.placement_problem:
            line = f"does not fit: {self.placement_problem}"
        elif gpu is None:
            return "fits: nothing to place on a GPU"
        elif memory is None:
            return (f"memory not checked (no GPU memory known: --plan.gpu_memory); the fullest GPU holds "
                    f"{format_bytes(self.peak(gpu))}")
        elif self.fits:
            return (f"fits: the fullest GPU (node {gpu.node} GPU {gpu.index}) holds {format_bytes(self.peak(gpu))} of "
                    f"{format_bytes(memory)}" + (f"; not estimated: {', '.join(self.unestimated())}" if self.unestimated() else ""))
        else:
            top = sorted(((part.nbytes or 0, f"{seat.group} {part.part} {format_bytes(part.nbytes)}")
                          for seat in gpu.seats for part in self.parts[seat.group]), reverse=True)[:3]
            line = (f"does not fit: node {gpu.node} GPU {gpu.index} ({', '.join(s.label for s in gpu.seats)}) needs "
                    f"{format_bytes(self.peak(gpu))} of {format_bytes(memory)} ({'; '.join(t for _, t in top)})")
        if self.fix:
            return f"{line}; the first change that fits: {self.fix}"
        return (f"{line}; none of the {self.tried} changes and pairs of changes tried fits"
                + (f"; the closest: {self.closest}" if self.closest else ""))


def run_groups(trainer: type, config: PlannedConfig, registry: ComponentRegistry) -> RunGroups:
    """The trainer's model groups and engines (its optional classmethod ``plan_groups(config, registry)``)."""
    plan_groups = getattr(trainer, "plan_groups", None)
    if plan_groups is None:
        raise ConfigError(f"trainer {trainer.__name__} does not describe its model groups (no plan_groups): it cannot "
                          "be planned")
    return plan_groups(config, registry)


def plan_run(trainer: type, config: PlannedConfig, registry: ComponentRegistry, cluster: Cluster | None, *, remedies: bool = True) -> Plan:
    """The plan of ``config`` on ``cluster`` (None: a cluster of exactly the GPUs the run asks for, memory unknown)."""
    groups = run_groups(trainer, config, registry)
    config, notes = capped_sequence(config, groups)
    if cluster is None:
        cluster = Cluster(paper_nodes(requested_gpus(config, groups), 8), None, "as many GPUs as the run asks for")
    if groups.per_device:  # as many ranks as the cluster has GPUs
        world = int(sum(cluster.nodes)) or 1
        groups.models = [replace(m, ranks=world) for m in groups.models]
    gpus, problem = lay_out(config, groups, cluster.nodes, cluster.name())
    parts = {key: model_parts(config, registry, model) for key, model in group_keys(groups).items()}
    if groups.engine is not None:
        parts["engine"] = engine_parts(config, groups, cluster.gpu_memory)
    plan = Plan(cluster, gpus, parts, problem, notes=notes)
    if remedies and plan.fits is False:
        def cluster_for(changed: PlannedConfig) -> Cluster:
            needed = requested_gpus(changed, run_groups(trainer, changed, registry))
            return Cluster(paper_nodes(needed, int(max(cluster.nodes, default=8)) or 8), cluster.gpu_memory, "")

        found = search(config, registry, plan, {m.role: m.ranks for m in groups.models}, groups.engine,
                       lambda changed, on: plan_run(trainer, changed, registry, on, remedies=False), cluster_for)
        plan.fix, plan.closest, plan.tried = found.fix, found.closest, found.tried
    return plan


def capped_sequence(config: PlannedConfig, groups: RunGroups) -> tuple[PlannedConfig, list[str]]:
    """``config`` with ``--data.max_len`` capped at the actor's ``max_position_embeddings``, as the run caps it
    (:class:`rlhf.runtime.control.controller.PPOController`), and the note saying so."""
    actor = next((m for m in groups.models if m.role == "actor"), None)
    positions = model_shape(actor.path, actor.flag).max_positions if actor else None
    if not positions or positions >= config.data.max_len:
        return config, []
    return changed_config(config, {"data.max_len": positions}), [
        f"--data.max_len {config.data.max_len} is more than the actor's max_position_embeddings {positions}: "
        f"planned at {positions}, as the run caps it"]


def model_parts(config: PlannedConfig, registry: ComponentRegistry, model: ModelGroup) -> list[MemoryPart]:
    """One GPU of ``model``'s group: the training backend's model states (its ``plan_memory``) and the activations."""
    shape = model_shape(model.path, model.flag)
    if model.value_head:
        shape = shape.value_model()
    section, ds = model.section, config.ds
    trainable = shape.parameters
    if ds.lora.rank > 0 and model.trained:
        trainable = shape.lora_parameters(ds.lora.rank, ds.lora.target_modules)
    optimizer_bytes = None
    if model.trained:
        optimizer = registry.get(ComponentKind.OPTIMIZER, section.optim, flag="--optim")
        state_bytes = getattr(optimizer, "plan_state_bytes", None)
        optimizer_bytes = state_bytes(shape, trainable) if state_bytes is not None else None
    planned = PlannedModel(model.role, shape, model.trained, model.ranks, trainable, optimizer_bytes,
                           offload=bool(getattr(section, "offload", False)), section=section)
    backend = backend_class(config, registry)
    plan_memory = getattr(backend, "plan_memory", None)
    parts = (plan_memory(config, planned) if plan_memory is not None
             else [MemoryPart("model states", None, f"--train.backend {config.train.backend} does not say")])
    extra = [part for extension in active(config, registry) if hasattr(extension, "plan_memory")
             for part in extension.plan_memory(config, planned)]  # a model plugin's own GPU memory (e.g. a routing record)
    return parts + [activations(config, planned, model.checkpointing),
                    *logits_parts(config, planned, response_tokens(config, registry)), *extra]


def micro_batch_tokens(config: PlannedConfig, trained: bool) -> int:
    """Tokens one GPU takes in one forward: a training micro-batch (``--train.micro_batch_size`` sequences, or
    ``--train.max_tokens_per_gpu`` with dynamic batching), or an experience forward's ``--rollout.micro_batch_size``
    sequences; over the ring-attention group."""
    train = config.train
    if trained and getattr(train, "dynamic_batch_enable", False):
        batch = train.max_tokens_per_gpu
    else:
        rollout = getattr(config, "rollout", None)
        sequences = rollout.micro_batch_size if rollout is not None and not trained else train.micro_batch_size
        batch = sequences * config.data.max_len
    return batch // max(1, config.ds.ring_attn_size)


def activations(config: PlannedConfig, model: PlannedModel, checkpointing: bool) -> MemoryPart:
    """The activations of one GPU of ``model`` but its logits: a training micro-batch's, or an inference forward's."""
    ds = config.ds
    sequence = config.data.max_len // max(1, ds.ring_attn_size)
    tokens = micro_batch_tokens(config, model.trained)
    checkpointing = checkpointing and model.trained
    nbytes = activation_bytes(model.shape, tokens, sequence, dtype_bytes(ds.param_dtype), checkpointing=checkpointing,
                              eager_attention=ds.attn_implementation == "eager", logits=False, backward=model.trained)
    how = f"{tokens} tokens" + (", checkpointed" if checkpointing else "") + ("" if model.trained else ", forward only")
    return MemoryPart("activations", nbytes, how)


def response_tokens(config: PlannedConfig, registry: ComponentRegistry) -> int:
    """Action tokens one sequence can have: ``--data.max_len`` less the prompt's first token, and at most
    ``--rollout.max_new_tokens`` where the run's agent executor makes each response one generation (its trait
    ``one_generation_per_request``; a multi-turn trajectory spans several, bounded only by ``--data.max_len``)."""
    room = max(1, config.data.max_len - 1)
    rollout = getattr(config, "rollout", None)
    limit = getattr(rollout, "max_new_tokens", None)
    name = getattr(config.train, "agent_executor", None)
    if not limit or name not in registry.names(ComponentKind.AGENT_EXECUTOR):
        return room
    executor = registry.get(ComponentKind.AGENT_EXECUTOR, name)
    return min(limit, room) if getattr(executor, "one_generation_per_request", False) else room


def logits_parts(config: PlannedConfig, model: PlannedModel, response: int) -> list[MemoryPart]:
    """What the LM head's output takes on one GPU of ``model`` (nothing for a value head): the logits of a whole
    micro-batch in the weights' dtype (and their gradient, as large, in a training backward; a trained actor's
    experience forward over ``--rollout.micro_batch_size`` sequences where that is larger), and one chunk of the
    log-probs computed from them in fp32 (:data:`CHUNK_COPIES` copies of ``chunk x vocab``). The chunk holds at most
    ``LOGPROB_CHUNK_TOKENS`` positions and no more than a forward's action tokens: its sequences x ``response``
    (:func:`response_tokens`), since only the positions that predict a response token are read."""
    vocab = model.shape.vocab
    if not vocab:
        return []
    size = dtype_bytes(config.ds.param_dtype)
    forward, trained = micro_batch_tokens(config, trained=False), micro_batch_tokens(config, trained=True)
    if model.trained and 2 * trained > forward:
        logits, how = 2 * trained * vocab * size, f"{trained} tokens x {vocab} x {size} B x 2 (and their gradient)"
    else:
        logits, how = forward * vocab * size, f"{forward} tokens x {vocab} x {size} B, forward"
    actions = max(action_tokens(config, False, response), action_tokens(config, True, response) if model.trained else 0)
    chunk = min(logprob_chunk_tokens(), actions)
    return [MemoryPart("logits", logits, how),
            MemoryPart("log-prob chunk", CHUNK_COPIES * chunk * vocab * 4, f"{CHUNK_COPIES} x {chunk} tokens x {vocab} x "
                       f"4 B (fp32 logits and {'their gradient' if model.trained else 'probabilities'})")]


def action_tokens(config: PlannedConfig, trained: bool, response: int) -> int:
    """Positions of one forward (:func:`micro_batch_tokens`) whose log-probs are read: at most its sequences x
    ``response`` (with dynamic batching the sequences are not fixed: its tokens bound them)."""
    tokens = micro_batch_tokens(config, trained)
    if trained and getattr(config.train, "dynamic_batch_enable", False):
        return tokens
    rollout = getattr(config, "rollout", None)
    sequences = rollout.micro_batch_size if rollout is not None and not trained else config.train.micro_batch_size
    return min(tokens, sequences * response // max(1, config.ds.ring_attn_size))


def logprob_chunk_tokens() -> int:
    """Action tokens whose log-probs are computed at once (``rlhf.ops.LOGPROB_CHUNK_TOKENS``, read when planned so that
    a test may change it)."""
    return ops.LOGPROB_CHUNK_TOKENS


def engine_parts(config: PlannedConfig, groups: RunGroups, gpu_memory: int | None) -> list[MemoryPart]:
    """One GPU of one rollout engine: the engine's ``plan_memory(config, shape, gpu_memory)``."""
    actor = next(m for m in groups.models if m.role == "actor")
    plan_memory = getattr(groups.engine, "plan_memory", None)
    if plan_memory is None:
        return [MemoryPart("engine", None, f"{groups.engine.__name__} does not say")]
    return plan_memory(config, model_shape(actor.path, actor.flag), gpu_memory)
