"""The systems components: rollout engines, weight-sync transports and training backends.

Shapes and the build rules: :mod:`rlhf.components`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

from rlhf.payloads import GenerationRequest, GenerationResult

if TYPE_CHECKING:
    from rlhf.components.models import OptimizerFactory, SchedulerFactory
    from rlhf.config.run import RunConfig


@runtime_checkable
class RolloutEngine(Protocol):
    """Generates rollouts token-in/token-out with the policy's weights (a copy, or the trained ones).

    Selected with ``--rollout.engine NAME`` (default ``auto``, see below).

    Where it lives (trait ``in_training_rank``):

    * False — ``max(1, --vllm.num_engines)`` engines, each built inside a Ray actor of its own (the
      core's :class:`rlhf.runtime.rollout.engines.EngineActor`), once per run, after the core has given
      the actor its share of the CPU threads. It holds a copy of the policy, refreshed by the weight-sync
      transport after every training step.
    * True — one engine in each actor training rank (the trainer's own process), built once per run
      after the rank's trained model, which it then gets through :meth:`attach`. No engine process and
      no transport: each rank gets an equal share of every generation batch. With the trait
      ``shares_trained_weights = True`` it generates with the trained tensors themselves and nothing is
      reloaded; otherwise (vLLM's own layout) the core calls :meth:`load_weights` in every rank after
      each training step with that rank's whole weights. The core refuses it (one line,
      before Ray starts) when the training backend's optional ``sharded_reason(config)`` says the
      parameters are split over the ranks (ZeRO-3, AutoTP, FSDP2), unless the engine sets the trait
      ``gathers_sharded_parameters = True`` (then it must gather them itself, every rank in step: read the
      trained model's ``sharded``; the core calls every rank's :meth:`generate`, with an empty share too).
      Layers split over the ranks (the backend's ``tensor_parallel_reason``: AutoTP) are refused even then (its
      ranks would need the same requests), and so are shards with
      ``--train.async_enable`` (each rank could meet generation and training in a different order).

    Every method below runs where the engine lives.

    Constructor: ``(model_path, param_dtype, max_model_len, seed, config)`` — an HF model directory,
    ``"bf16" | "fp16" | "fp32"``, the longest prompt + response in tokens, the engine's seed
    (``--train.seed`` + engine index or rank), the run's dumped config as a dict (or a part of it:
    read optional keys with ``.get``). An in-rank engine loads no weights here.

    Optional classmethods the core calls in the CLI process before anything starts:
    ``check_config(config) -> None`` raising :class:`rlhf.errors.ConfigError` for a run it cannot serve;
    ``auto_preference(config) -> int | None``: how much ``auto`` wants this engine for the run (the
    highest wins among the engines that can serve it; None or absent: never picked by ``auto``). The
    first-party ones keep OpenRLHF's meaning of ``--vllm.num_engines``: above 0 vLLM; else HF generate
    in the training ranks (``hf-inprocess``) where the weights are whole there, else ``hf``.

    Optional classmethod for ``rlhf plan`` (docs/plan.md), in the CLI process before anything starts:
    ``plan_memory(config, shape, gpu_memory) -> list[rlhf.planning.MemoryPart]``, what one GPU of one engine holds
    (``shape``: the policy's :class:`rlhf.planning.ModelShape`; ``gpu_memory``: bytes of one GPU, None where unknown,
    e.g. a CPU machine); absent: the engine is shown as "not estimated". And ``plan_remedies(config, run:
    rlhf.planning.RemedyContext) -> list[rlhf.planning.Remedy]``, once per search of a plan that does not fit, asked
    of every installed engine where the run generates: changes of its own flags (a switch to it included) that could
    make the run fit, its sleep paired with ``run.backend_sleep``.

    Optional method of an in-rank engine, in the rank: ``use_extensions(extensions: list) -> None``, once, before
    :meth:`attach`: the rank's model extensions (:mod:`rlhf.models.extensions`, built by its model worker as the model
    loaded), to record per-token values with (``recording``) instead of building a second set.

    Optional trait ``records_token_values = True``: the engine enters :func:`rlhf.models.extensions.recording` around
    each ``generate`` call and returns what the model extensions recorded (``GenerationResult.token_records``, e.g. the
    experts MoE routing replay routes by). Absent or False: a run whose model extension needs those records (its
    ``needs_engine_records``) is refused in one line before anything starts.

    Optional classmethod, where the engine lives: ``error_hint(exc) -> str | None``, the way out (a flag, another
    engine) when the library under the engine refuses the run as it is built or first used
    (:mod:`rlhf.components.first_use`); None or absent: the core names the other installed engines.
    """

    in_training_rank: ClassVar[bool]

    def generate(self, requests: list[GenerationRequest], temperature: float, top_p: float) -> list[GenerationResult]:
        """One result per request, in request order; once per generation batch (a rollout batch's
        share, a dynamic-filtering refill, an eval batch, or one agent turn).

        A request holds ``prompt_ids`` (list[int]), ``max_tokens`` (int), ``seed`` (int) and optionally
        ``media`` (a VLM's encoded images: ``{"images": [bytes, …]}``). A result holds ``response_ids``
        (list[int], 1 to ``max_tokens`` tokens), ``logprobs`` (list[float], one per response token: the
        log-prob of the sampled token under the distribution actually sampled, i.e. the logits divided
        by ``temperature``, before top-p) and ``finish_reason`` (``"stop"`` at EOS, ``"length"`` after exactly
        ``max_tokens`` tokens).
        """
        ...

    def attach(self, trained: TrainedModel) -> None:
        """In-rank engines only: generate with ``trained`` (this rank's :class:`TrainedModel`; read
        ``trained.module``) from now on. Once per run, in the rank, before any :meth:`generate`."""
        ...

    def load_weights(self, state: dict[str, Any]) -> None:
        """Replace the weights: ``state`` maps HF parameter names to CPU or device tensors (the
        trained dtype); a VLM's frozen parts may be missing. Once per weight sync."""
        ...

    def sleep(self) -> None:
        """Free device memory between generations (``--vllm.enable_sleep``); a no-op where there is none."""
        ...

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Restore what :meth:`sleep` freed: ``["weights"]`` before a sync, None (everything) before generating."""
        ...

    def sequence_logprobs(self, token_ids: list[int]) -> list[float]:
        """Log-prob of every token after the first under the current weights (temperature 1); for checks."""
        ...

    def max_weight_difference(self, state: dict[str, Any]) -> tuple[float, int]:
        """Largest ``|engine weight - state[name]|`` and how many tensors were compared; for checks."""
        ...


@runtime_checkable
class WeightSource(Protocol):
    """What a weight-sync transport sees of one actor training rank (built by the core, in that rank)."""

    rank: int
    world_size: int
    #: the transport's own per-rank storage, kept between calls (e.g. a process group)
    state: dict[str, Any]

    def layout(self) -> list[tuple[str, tuple[int, ...], str]]:
        """Every tensor a sync sends, in order: ``(HF name, full shape, torch dtype name)``."""
        ...

    def gathered_buckets(self, layout: list[tuple[str, tuple[int, ...], str]]) -> Any:
        """Iterate ``(bucket, tensors)``: consecutive runs of ``layout`` of one dtype (at most
        ``RLHF_SYNC_BUCKET_MB``, default 64 MiB) with their full tensors, valid until the next
        iteration. Every rank must iterate it (sharded weights are gathered collectively)."""
        ...

    def full_state(self) -> dict[str, Any] | None:
        """Every rank calls it; rank 0 gets the full CPU state dict under HF names, the others None."""
        ...


@runtime_checkable
class WeightSyncTransport(Protocol):
    """Moves the actor's weights into every rollout engine after each training step.

    Selected with ``--vllm.sync_backend NAME``; ``auto`` takes, of the installed transports that
    can run for the config, the one with the highest ``auto_preference``. Built with
    :func:`build` in the controller, once per run; the instance is pickled to the actor ranks and
    the engine actors for its other halves.

    Three halves, by process:

    * controller: :meth:`connect` once before the first sync, :meth:`sync` once per step (and on resume);
    * actor ranks: methods the transport calls through ``actor.call_async("weight_sync_call", self,
      "method", *args)``; the core runs ``getattr(self, "method")(source, *args)`` in every rank with a
      :class:`WeightSource`;
    * engines: ``engine_actor.weight_sync_call.remote(self, "method", *args)`` runs
      ``getattr(self, "method")(engine, state, *args)`` in the engine's actor with the
      :class:`RolloutEngine` and a dict kept between calls.
    """

    auto_preference: ClassVar[int]
    #: optional, default False: the transport also serves an actor whose one rank lives in the controller's process
    #: (``--train.in_process``; where the Ray cluster has no GPU, ranks share it with engines in Ray actors). Such a
    #: rank runs each call as it is made, in the caller's thread, and returns a finished Ray ``ObjectRef``, so the
    #: transport must start each exchange's engine side before the actor's (the rank waits there for its peers).
    #: Without it, the ranks stay in Ray workers.
    serves_in_process_actor: ClassVar[bool]

    @classmethod
    def unavailable_reason(cls, config: RunConfig, cuda: bool) -> str | None:
        """Why this transport cannot run for ``config`` (a :class:`rlhf.config.ppo.PPOConfig`) on a
        machine with or without CUDA, naming the flag to change; None when it can. In the CLI process, before
        Ray starts and again once it has: ``cuda`` is then whether the Ray cluster has GPUs, which a driver on
        a head node without any does not see itself."""
        ...

    def connect(self, actor: Any, engines: list[Any]) -> None:
        """Controller, once: set up (form a group, exchange the layout). ``actor`` is the actor's
        worker group (``call_async(method, *args)`` -> one Ray ref per rank), ``engines`` the engine actors."""
        ...

    def sync(self, actor: Any, engines: list[Any]) -> None:
        """Controller, once per sync: return when every engine holds the actor's current weights."""
        ...


@runtime_checkable
class TrainedModel(Protocol):
    """One model wrapped by a :class:`TrainingBackend` for training, in the process that built it.

    Returned by :meth:`TrainingBackend.trained`. Every method runs in that process; a method that
    says "every rank" must be called by every rank of the group in the same order (a sharded
    backend runs collectives inside it). Called per micro-batch: ``__call__``, :meth:`backward`,
    :meth:`step`; per optimizer step or less often: the rest.

    Optional attribute ``sharded: bool`` (absent: False): True where ``module``'s parameters are split over the
    ranks so that each forward of it is a collective (ZeRO-3 and FSDP2 all-gather every layer, AutoTP all-reduces
    its slices). An in-rank rollout engine that gathers sharded parameters reads it to run its forwards in step.
    """

    #: the HF model (``torch.nn.Module``) being trained; under sharding its parameters may be shards
    module: Any
    #: the ``torch.device`` inputs go to
    device: Any
    #: the torch optimizer and LR scheduler built from the selected components (their param groups are read
    #: and an ``lr_scale`` steering coefficient rescales ``param_groups[i]["lr"]`` before a step)
    optimizer: Any
    lr_scheduler: Any

    def __call__(self, **inputs: Any) -> Any:
        """The HF forward of ``module`` (``input_ids (B, L)``, ``attention_mask``, …): its output object."""
        ...

    def train(self) -> None:
        """Training mode (dropout on); before a fit."""
        ...

    def eval(self) -> None:
        """Evaluation mode; before no-grad forwards."""
        ...

    def accumulation_steps(self) -> int:
        """Micro-batches per optimizer step with fixed micro-batches: ``train.batch_size //
        (train.micro_batch_size × data-parallel ranks)``, at least 1."""
        ...

    def backward(self, loss: Any, boundary: bool | None = None) -> None:
        """Accumulate the gradient of ``loss`` (a scalar tensor, this rank's micro-batch), every rank.

        ``boundary=None`` (fixed micro-batches): the loss is divided by :meth:`accumulation_steps` and
        every :meth:`accumulation_steps`-th :meth:`step` is an optimizer step. A bool (token-budget
        micro-batches, whose count varies): no division, and True marks the last micro-batch of an
        optimizer step. Either way the gradient is averaged over the data-parallel ranks, and every
        rank calls it as often as the others (the core pads a short rank with a zero-weight pass), so a
        backend may reduce gradients inside each call.
        """
        ...

    def step(self) -> bool:
        """After every :meth:`backward`, every rank. At an optimizer-step boundary: clip the global
        gradient norm to ``max_norm``, step the optimizer and the scheduler, zero the gradients and
        return True; otherwise return False."""
        ...

    def learning_rate(self) -> float:
        """The current learning rate of the first parameter group."""
        ...

    def state_dict(self, copy: bool = True) -> dict[str, Any] | None:
        """Every rank: the full (unsharded) state dict of ``module`` on the CPU under HF names, or None on
        ranks that do not receive it (only rank 0 is guaranteed one). ``copy=False`` may return live
        tensors where they are whole already, for a caller that serialises them before the next step."""
        ...

    def gathered(self) -> Any:
        """Every rank: a context manager in which ``module``'s parameters are whole, for reading (a LoRA
        merge reads them); a no-op where nothing is sharded."""
        ...

    def full_tensors(self, names: list[str]) -> Any:
        """Every rank: a context manager yielding the whole tensors of these ``module.state_dict()``
        entries, in order, valid inside the block only (a weight sync reads one bucket at a time, so
        no rank holds the whole model unsharded)."""
        ...

    def full_shape(self, tensor: Any) -> tuple[int, ...]:
        """The unsharded shape of one of ``module.state_dict(keep_vars=True)``'s tensors."""
        ...

    def save_checkpoint(self, directory: str, tag: str) -> None:
        """Every rank: write the model, optimizer and scheduler states (each rank its shard) under
        ``directory/tag`` for an exact resume. ``directory`` is the step's staging folder (the
        ``global_stepN`` being written, which the core commits atomically once every rank has returned);
        ``tag`` is the model's role: ``actor``, ``critic``, or ``model`` in a supervised run. Neither is
        the step number (the core's ``state.json`` beside them records it)."""
        ...

    def load_checkpoint(self, directory: str, tag: str) -> None:
        """Every rank: load what :meth:`save_checkpoint` wrote under ``directory/tag``. ``directory`` is now
        the committed ``global_stepN`` folder, ``tag`` the role as when saving; the run may have another number
        of ranks than wrote it (reshard, or raise a :class:`rlhf.errors.CheckpointError` saying it cannot). A
        checkpoint that is missing or damaged raises :class:`rlhf.errors.CheckpointError` naming
        ``directory/tag``; one that is intact but does not fit this run (another world size, backend or model
        shape) says which and the flag that fits it: "damaged" and "delete" only for a damaged one."""
        ...

    def awake(self, phase: str) -> Any:
        """A context manager around a fit or a checkpoint (``phase`` names it): with sleep on, the
        optimizer states are on the device inside and offloaded again after; otherwise a no-op."""
        ...

    def sleep_history(self) -> list[tuple[str, float]]:
        """With sleep on, this rank's ``("offload" | "reload" | phase, wall-clock time)`` events in order."""
        ...


@runtime_checkable
class TrainingBackend(Protocol):
    """Trains and evaluates the models of one process of a distributed group (DeepSpeed ZeRO, FSDP2…).

    Selected with ``--train.backend NAME`` (default ``deepspeed``). Built with :func:`build` once
    per process that holds a model: every rank of a PPO run's actor, critic, reference and
    reward-model Ray worker groups, and every rank of a supervised run (``rlhf train sft|rm|dpo…``,
    one process per device). ``config`` is the run's (``PPOConfig`` or a supervised config): a
    backend reads ``config.ds`` (``param_dtype``, ``zero_stage``, offload flags…) and
    ``config.train`` (``micro_batch_size``, ``batch_size``, ``max_norm`` via the optimizer section).

    Optional classmethods: ``check_config(config) -> None``, called in the CLI process once before
    anything starts, raising :class:`rlhf.errors.ConfigError` for flags it cannot honour;
    ``check_groups(config, groups) -> None``, right after it, with the run's model groups
    (``list[rlhf.planning.ModelGroup]``: each group's ``role``, ``ranks``, ``trained`` and ``ranks_from``, the flags
    that set its ranks), to refuse a layout it cannot serve (one rank only, no critic…) naming those flags;
    ``preload() -> None``, called in each model worker as it is created, for slow imports that can
    overlap the controller's start-up; and ``sharded_reason(config) -> str | None``, in the CLI
    process and the actor ranks: why a trained model's parameters are not whole on every rank for
    this config, naming the flag (``"--ds.zero_stage 3 splits its parameters over the ranks"``), or
    None where they are; absent means always whole. An in-rank rollout engine is refused with it. And
    ``error_hint(exc) -> str | None``, in the process where it happened: the way out when the library under the
    backend refuses the run during set-up, a model load or the first step (:mod:`rlhf.components.first_use`). And for
    ``rlhf plan`` (docs/plan.md), in the CLI process: ``plan_memory(config, model) -> list[rlhf.planning.MemoryPart]``,
    what one GPU of one model group holds (``model``: a :class:`rlhf.planning.PlannedModel`): weights, gradients,
    optimizer states, buffers (the core adds the activations); absent: its model states are shown as "not estimated";
    and ``plan_remedies(config, run: rlhf.planning.RemedyContext) -> list[rlhf.planning.Remedy]``, once per search of
    a plan that does not fit: changes of its own flags that could make the run fit (a ``sleep`` one is handed to the
    engines, not tried alone). ``tensor_parallel_reason(config) -> str | None``, in the CLI process and the actor
    ranks: why each layer is split over a group's ranks, naming the flag, or None (an in-rank engine that gathers
    shards is refused with it).
    For checkpoints (:mod:`rlhf.records.checkpoint_fit`, ``rlhf checkpoint``): ``checkpoint_layout(config) -> dict``,
    how a trained model's states are split, recorded with each checkpoint; and ``full_state_from_checkpoint(directory,
    tag, module, ema=False) -> dict[str, Tensor]``, in a process of its own without a group: the whole fp32 state that
    :meth:`TrainedModel.save_checkpoint` wrote there, by ``module.state_dict()``'s names (``ema``: with the EMA's
    trainable parameters), for ``rlhf checkpoint export``. For a resume under another ``--train.backend`` (the
    backend-neutral full state, :func:`rlhf.config.training_backend.load_from_other_backend`): the writer's
    ``optimizer_state_from_checkpoint(directory, tag, module) -> {"state": {name: {key: tensor}}, "steps": int}``
    (classmethod, every rank, no collective: each trainable parameter's optimizer states whole, by name, in torch's
    keys without ``step``, and the optimizer steps taken) beside ``full_state_from_checkpoint``; and the resuming
    backend's ``load_full_state(model, weights, optimizer_state) -> None`` (every rank: those whole tensors into its
    :class:`TrainedModel`'s shards, each Adam-family parameter's ``step`` set to ``steps``).
    """

    def init_distributed(self) -> None:
        """Join the default ``torch.distributed`` group from ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``
        and ``MASTER_PORT`` (set by the core or a launcher): gloo on CPU, NCCL on CUDA. Once per
        process, before any model; a no-op when the group exists."""
        ...

    def trained(self, load: Any, optimizer: OptimizerFactory, scheduler: SchedulerFactory, section: Any,
                data_parallel_size: int, num_training_steps: int) -> TrainedModel:
        """Every rank, once per trained model (actor, critic, the supervised model): call ``load()``
        (returns the HF ``torch.nn.Module``, with LoRA applied if asked) where weights may be sharded as
        they are created, wrap it, and build the optimizer and the scheduler from the selected
        components (``section``: the optimizer section, with ``max_norm`` for clipping)."""
        ...

    def evaluated(self, load: Any, offload: bool, micro_batch_size: int) -> Any:
        """Every rank, once per inference-only model (reference, reward model, teacher): ``load()`` it
        as :meth:`trained` does and return a callable forward module with ``.module`` (the HF model),
        ``.device`` and ``eval()``; ``offload``: keep its weights off the device between forwards."""
        ...

    def gathered(self, module: Any) -> Any:
        """Every rank: a context manager in which ``module``'s parameters are whole and writes to them
        made on every rank persist (same values everywhere); for initialising a part at load time."""
        ...
