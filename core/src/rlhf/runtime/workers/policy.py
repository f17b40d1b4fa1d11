"""The causal-LM model workers: actor (policy, trained) and reference, over the shared worker base.

The critic and the reward model (value heads) are in ``rlhf.runtime.workers.value``.

Every method here runs inside a Ray actor, once per rollout batch (``logprobs``,
``values``, ``rewards``, ``train``) or once per sync/checkpoint. Payloads are plain
lists per sample (token ids, per-token floats) so they cross Ray cheaply; tensors
are built inside the worker. Per-token tensors are ``(B, T)`` over response tokens.
"""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path
from typing import Any

from rlhf.components import build
from rlhf.components.first_use import FirstUse
from rlhf.config.rollout_engine import engine_label, rollout_engine_class, uses_engine
from rlhf.config.training_backend import load_trained_checkpoint
from rlhf.errors import ConfigError
from rlhf.models.extensions import ForwardTokens, active, before_forward, extension_metrics, load_model
from rlhf.models.loading import dtype_of, load_causal_lm, token_id
from rlhf.models.lora import apply_lora, is_peft, merged_state_dict, quantization_kwargs
from rlhf.models.saving import without_deepspeed_import
from rlhf.records.checkpoints import published
from rlhf.registry import ComponentKind as K
from rlhf.runtime.sync.weights import ActorWeights
from rlhf.runtime.workers.batch import action_logprobs, pack, pad_list
from rlhf.runtime.workers.group import BaseWorker
from rlhf.runtime.workers.micro_batches import packed_forward, plan
from rlhf.runtime.workers.objective import ObjectiveSettings, StepNormalisers, policy_objective, step_counts


def in_rank_engine(engine_class: type, trained: Any, extensions: list[Any], *args: Any) -> Any:
    """``engine_class(*args)`` (an ``in_training_rank`` engine) on this rank's trained model, handed the rank's model
    extensions first where it takes them (``use_extensions``): one set per rank, not a second one on the same model."""
    engine = engine_class(*args)
    if hasattr(engine, "use_extensions"):
        engine.use_extensions(extensions)
    engine.attach(trained)
    return engine


def _action_masks(payload: dict[str, list], rows: Any) -> list[list[int] | None] | None:
    """The rows' action masks (multi-turn samples mark environment tokens 0), or None when every token is the model's."""
    masks = payload.get("action_masks")
    return None if masks is None else [masks[i] for i in rows]


def _action_count(payload: dict[str, list], row: int) -> int:
    masks = payload.get("action_masks")
    return len(payload["response_ids"][row]) if masks is None or masks[row] is None else int(sum(masks[row]))


def _padded_column(payload: dict[str, list], rows: list[int], width: int, device: Any, key: str) -> Any:
    """``(len(rows), width)`` tensor of one per-token payload column, on ``device`` (the model's)."""

    return pad_list([payload[key][i] for i in rows], width).to(device)


def _sample_lengths(payload: dict[str, list]) -> list[int]:
    return [len(p) + len(r) for p, r in zip(payload["prompt_ids"], payload["response_ids"])]


def while_awake(method: Any) -> Any:
    """Decorate a worker method (a fit, a checkpoint save or load) to run with its trained model awake
    (:meth:`rlhf.components.TrainedModel.awake`: its offloaded states back on the device)."""
    @functools.wraps(method)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        with self.model.awake(method.__name__):
            return method(self, *args, **kwargs)

    return wrapper


class _ModelWorker(BaseWorker):
    """Micro-batch loops shared by every model worker."""

    #: the trained model (:class:`rlhf.components.TrainedModel`) or the evaluated one of this rank
    model: Any
    pad_id: int
    #: ranks per AutoTP group (--ds.tensor_parallel_size) of a trained model; they get the same samples
    tp = 1
    #: the current micro-batch's accumulation boundary with dynamic batches (None: fixed micro-batches)
    _boundary: bool | None = None
    #: the model plugins this run switched on (rlhf.models.extensions), built as the model loaded (none before)
    extensions: tuple[Any, ...] | list[Any] = ()

    def _load(self, role: str, path: str, default: Any) -> Any:
        """The model of ``role`` through the model plugins this run switched on (Liger, ring attention, VLM)."""

        self.extensions = active(self.config, self.plugins.registry)
        return load_model(self.extensions, role, self.config, path, default)

    def _load_checkpoint(self, directory: str, tag: str, writer: str | None) -> None:
        """``--ckpt.load_enable``: the trained model's states under ``directory/tag``; through the backend-neutral full
        state where ``writer`` (the ``--train.backend`` that wrote them, from ``state.json``) is another backend."""
        load_trained_checkpoint(self.config, self.backend, self.model, writer, Path(directory), tag, self.plugins.registry)

    def _batch(self, payload: dict[str, list], rows: list[int], training: bool = False) -> Any:
        """The :class:`~rlhf.runtime.workers.batch.TokenBatch` of these samples on the model's device, packed with
        ``--ds.packing_samples`` where that is the faster path (:func:`~rlhf.runtime.workers.micro_batches.packed_forward`).
        The model extensions' ``before_forward`` sees where each sample sits and what its engine recorded."""

        if not hasattr(self, "_packed"):
            self._packed = packed_forward(self.config)
        media = [payload["media"][i] for i in rows] if payload.get("media") else None
        batch = pack([payload["prompt_ids"][i] for i in rows], [payload["response_ids"][i] for i in rows], self.pad_id,
                     packed=self._packed, media=media, action_masks=_action_masks(payload, rows)).to(self.model.device)
        if self.extensions:
            lengths = [len(payload["prompt_ids"][i]) + len(payload["response_ids"][i]) for i in rows]
            records = payload.get("token_records")
            before_forward(self.extensions, self.model.module, ForwardTokens(
                tuple(batch.input_ids.shape), batch.rows.tolist(), [int(end) - n + 1 for end, n in zip(batch.last_index.tolist(), lengths)],
                lengths, [records[i] for i in rows] if records else [None] * len(rows), training))
        return batch

    def _per_token_rows(self, payload: dict[str, list], compute: Any) -> list[list[float]]:
        """Run ``compute(TokenBatch) -> (B, T)`` without gradients over ``--rollout.micro_batch_size``
        micro-batches (token-budget ones with dynamic batching); one list of floats per sample, as long
        as its response."""
        import torch

        cfg = self.config
        budget = (cfg.rollout.max_tokens_per_gpu or cfg.train.max_tokens_per_gpu) if cfg.train.dynamic_batch_enable else None
        responses = payload["response_ids"]
        out: list[list[float]] = []
        self.model.eval()
        with torch.no_grad():
            for idx in plan(list(range(len(responses))), _sample_lengths(payload), cfg.rollout.micro_batch_size, budget,
                            self.world_size, self.model.device):
                values = compute(self._batch(payload, idx or [0])).float().cpu()  # a filler pass keeps ZeRO-3 ranks in step
                out += [values[j, : len(responses[i])].tolist() for j, i in enumerate(idx)]
        return out if self.rank % self.tp == 0 else []  # one answer per tensor-parallel group

    def _training_groups(self, payload: dict[str, list], step: int, salt: int):
        """Yield ``(rows, step_tokens, step_sequences, weight)`` per micro-batch over ``--train.max_epochs``
        seeded shuffles; the caller backpropagates ``weight`` x its loss with :meth:`_backward`.

        An optimizer step covers ``--train.batch_size`` samples over all ranks, split into
        ``--train.micro_batch_size`` micro-batches or, with ``--train.dynamic_batch_enable``, into
        micro-batches of at most ``--train.max_tokens_per_gpu`` tokens (then the accumulation boundary
        is set here, as their number varies). The counts cover the whole optimizer step (every
        micro-batch on every rank): the normalisers of one exact token (or sequence) mean per
        optimizer step, however the step is split. ``step_sequences`` counts only responses with at
        least one token, as seq-mean-token-mean divides by them alone. ``weight`` is 0 for a filler
        pass that keeps the ranks' collectives paired.
        """
        import torch

        cfg = self.config
        n = len(payload["prompt_ids"])
        micro, dynamic = cfg.train.micro_batch_size, cfg.train.dynamic_batch_enable
        per_step = micro * self.model.accumulation_steps()
        lengths = _sample_lengths(payload)
        self.model.train()
        for epoch in range(cfg.train.max_epochs):
            seed = cfg.train.seed * 100003 + step * 101 + epoch + salt
            order = torch.randperm(n, generator=torch.Generator().manual_seed(seed)).tolist()
            for start in range(0, n, per_step):
                group = order[start : start + per_step]
                counts = torch.tensor(step_counts([_action_count(payload, i) for i in group]), device=self.model.device)
                if self.world_size > 1:
                    torch.distributed.all_reduce(counts)  # on the model's device: NCCL takes no CPU tensor
                    counts = counts / self.tp  # the ranks of a tensor-parallel group counted the same samples
                batches = plan(group, lengths, micro, cfg.train.max_tokens_per_gpu if dynamic else None, self.world_size,
                               self.model.device)
                for k, rows in enumerate(batches):
                    self._boundary = (k == len(batches) - 1) if dynamic else None
                    yield rows or group[:1], counts[0].clamp(min=1.0), counts[1].clamp(min=1.0), float(bool(rows))

    def _backward(self, loss: Any) -> None:
        """Backward of one micro-batch's share of the step loss (already divided by :meth:`_scale`)."""
        with self.backend_use.watch("backward"):
            self.model.backward(loss, boundary=self._boundary)

    def _optimizer_step(self) -> bool:
        """:meth:`rlhf.components.TrainedModel.step`; True when the optimizer stepped."""
        with self.backend_use.watch("optimizer step"):
            return self.model.step()

    def _trained_model(self, role: str, load_model: Any, num_training_steps: int) -> None:
        """The trained model of ``config.<role>`` (actor or critic) through the training backend, with the
        registered optimizer and scheduler."""

        section = getattr(self.config, role)
        registry = self.plugins.registry
        optimizer = build(registry.get(K.OPTIMIZER, section.optim, flag=f"--{role}.optim"), self.config)
        scheduler = build(registry.get(K.SCHEDULER, section.lr_scheduler, flag=f"--{role}.lr_scheduler"), self.config)
        self.tp = self.config.ds.tensor_parallel_size
        with self.backend_use.watch("trained", f"while it loaded the {role} for training"):
            self.model = self.backend.trained(load_model, optimizer, scheduler, section, self.world_size // self.tp,
                                              num_training_steps)
        self.pad_id = token_id(self.model.module, "pad_token_id") or 0

    def sleep_history(self) -> list[tuple[str, float]]:
        """``--ds.enable_sleep``: this rank's offloads, reloads and awake phases, in order, with their
        wall-clock times; empty without the flag."""
        return self.model.sleep_history()

    def _scale(self) -> float:
        """The backend averages over the data-parallel ranks and (fixed micro-batches only) divides by the
        accumulation steps: undo both."""
        if self.config.train.dynamic_batch_enable:
            return float(self.world_size // self.tp)
        return float(self.model.accumulation_steps() * self.world_size // self.tp)


class _CausalLMWorker(_ModelWorker):
    """Shared by the actor and the reference: per-token log-probs of responses."""

    def logprobs(self, payload: dict[str, list]) -> list[list[float]]:
        def compute(batch: Any) -> Any:
            logits = self.model(**batch.model_inputs()).logits
            return action_logprobs(logits, batch, self.config.rollout.temperature)[0]

        return self._per_token_rows(payload, compute)


class ReferenceWorker(_CausalLMWorker):
    role = "ref"

    def setup(self, master_addr: str, master_port: int) -> None:
        self._init_common(master_addr, master_port)
        ds, path = self.config.ds, self.config.actor.model_name_or_path

        def load() -> Any:
            return self._load("ref", path, lambda: load_causal_lm(path, dtype_of(self.config), ds.attn_implementation,
                                                                  experts=ds.experts_implementation))

        with self.backend_use.watch("evaluated", "while it loaded the reference model"):
            self.model = self.backend.evaluated(load, self.config.ref.offload, self.config.rollout.micro_batch_size)
        self.pad_id = token_id(self.model.module, "pad_token_id") or 0


class PolicyWorker(_CausalLMWorker):
    """The actor: trained by the training backend with the selected policy loss, optimizer and scheduler."""

    role = "actor"

    def setup(self, master_addr: str, master_port: int, num_training_steps: int) -> None:
        self._init_common(master_addr, master_port)
        cfg = self.config
        self.loss = build(self.plugins.registry.get(K.POLICY_LOSS, cfg.actor.policy_loss_type, flag="--actor.policy_loss_type"), cfg)
        self.settings = ObjectiveSettings.from_config(cfg, self.plugins.registry)  # builds the KL estimator once

        def load() -> Any:
            model = load_causal_lm(cfg.actor.model_name_or_path, dtype_of(cfg), cfg.ds.attn_implementation,
                                   experts=cfg.ds.experts_implementation, **quantization_kwargs(cfg.ds))
            checkpointing = cfg.actor.gradient_checkpointing_enable
            if checkpointing:
                model.gradient_checkpointing_enable({"use_reentrant": cfg.actor.gradient_checkpointing_reentrant})
            return apply_lora(model, cfg.ds, gradient_checkpointing=checkpointing)

        self._trained_model("actor", lambda: self._load("actor", cfg.actor.model_name_or_path, load), num_training_steps)
        self.ema = None
        if cfg.train.enable_ema:
            if not hasattr(self.model, "ema"):

                raise ConfigError(f"--train.enable_ema: the training backend {cfg.train.backend!r} keeps no EMA; "
                                  "drop the flag or use --train.backend deepspeed")
            self.ema = self.model.ema(cfg.train.ema_beta)
        #: an engine of the run's that lives in this rank (in_training_rank), on the trained model itself
        self.engine = None
        engine_class = rollout_engine_class(cfg, self.plugins.registry) if uses_engine(cfg, self.plugins.registry) else None
        if engine_class is not None and engine_class.in_training_rank:
            self.engine_use = FirstUse(engine_label(cfg, self.plugins.registry), engine_class)
            with self.engine_use.watch("construction", "while it was built on the trained model"):
                self.engine = in_rank_engine(engine_class, self.model, self.extensions, cfg.actor.model_name_or_path,
                                             cfg.ds.param_dtype, cfg.data.max_len, cfg.train.seed + self.rank, self._config_dict)
            if cfg.vllm.enable_sleep and not getattr(engine_class, "shares_trained_weights", False):
                self.engine.sleep()  # asleep until the controller wakes it for a phase (rlhf.runtime.rollout.sleep)

    def generate(self, requests: list[dict[str, Any]], temperature: float, top_p: float) -> list[dict[str, Any]]:
        """This rank's share of a generation batch, by its in-rank engine (see :meth:`setup`)."""
        with self.engine_use.watch("generate"):
            return self.engine.generate(requests, temperature, top_p)

    def engine_call(self, method: str, *args: Any) -> Any:
        """The in-rank engine's ``method(*args)``: ``sleep``/``wake_up`` around its phases (``--vllm.enable_sleep``),
        ``sequence_logprobs`` and ``max_weight_difference`` for checks."""
        return getattr(self.engine, method)(*args)

    @while_awake
    def train(self, payload: dict[str, list], step: int, kl_coef: float,
              coefficients: dict[str, float] | None = None) -> dict[str, float]:
        """``max_epochs`` passes of the actor objective over this rank's share of the rollout batch.

        Per micro-batch, ``policy_objective``: agg(c·ℓ) + β·token_mean(KL) [KL as loss]
        − c_H·token_mean(H) [entropy], plus the MoE auxiliary loss. Only the policy term follows
        ``--actor.loss_agg_mode`` (per-sequence when the loss is not token-level); every mean
        uses the normalisers of the whole optimizer step; c is the IS correction coefficient.
        ``coefficients`` (set by steering plugins, rlhf.steering): ``entropy`` replaces c_H,
        ``lr_scale`` multiplies the scheduled learning rate of this step's optimizer steps.
        """

        cfg = self.config
        coefficients = coefficients or {}
        settings = self.settings
        if "entropy" in coefficients:
            settings = dataclasses.replace(settings, entropy_coef=coefficients["entropy"])
        sums: dict[str, float] = {}
        count = 0
        for rows, tokens, sequences, weight in self._training_groups(payload, step, salt=0):
            batch = self._batch(payload, rows, training=bool(weight))
            mask = batch.action_mask
            column = functools.partial(_padded_column, payload, rows, mask.shape[1], mask.device)
            moe = {"output_router_logits": True} if cfg.actor.aux_loss_coef > 0 else {}
            output = self.model(**batch.model_inputs(), **moe)
            logp, entropy = action_logprobs(output.logits, batch, cfg.rollout.temperature,
                                            with_entropy=settings.entropy_coef is not None)
            # one on-policy optimizer step: the weights that sampled are the ones being
            # differentiated, so π_old is exactly this forward's value
            old = logp.detach() if payload["old_logprobs"] is None else column("old_logprobs")
            loss, metrics = policy_objective(
                self.loss, settings, StepNormalisers(float(tokens), float(sequences), self._scale()),
                logp, old, column("advantages"), mask,
                rollout_log_probs=column("rollout_logprobs") if settings.correcting else None,
                ref_log_probs=column("ref_logprobs") if payload.get("ref_logprobs") is not None else None,
                kl_coef=kl_coef,
                entropy=entropy)
            if moe and getattr(output, "aux_loss", None) is not None:
                loss = loss + cfg.actor.aux_loss_coef * output.aux_loss  # MoE balancing, per forward
                metrics["aux_loss"] = output.aux_loss.detach()
            self._backward(loss * weight)
            if "lr_scale" in coefficients and self.model.lr_scheduler is not None:
                for group, scheduled in zip(self.model.optimizer.param_groups, self.model.lr_scheduler.get_last_lr()):
                    group["lr"] = scheduled * coefficients["lr_scale"]  # the scheduler sets its own again after the step
            if self._optimizer_step() and self.ema is not None:
                self.ema.update()
            if weight:
                for key, value in metrics.items():
                    sums[key] = sums.get(key, 0.0) + float(value)
                count += 1
        result = {key: value / max(count, 1) for key, value in sums.items()}
        result.update(extension_metrics(self.extensions))
        result["actor_lr"] = self.model.learning_rate()
        return result

    def full_state(self) -> dict[str, Any] | None:
        """All ranks call this (ZeRO-3 gathers collectively); rank 0 returns the full CPU state dict
        under HF names (with LoRA: the base weights with the adapters folded in), the others None.
        Ray serialises it into the object store as the method returns, before any further step."""
        state = self._synced_state()
        return state if self.rank == 0 else None

    def _synced_state(self) -> dict[str, Any] | None:
        """What an engine is sent of this rank's model, as :meth:`full_state` describes it; None on a rank the
        training backend gives no whole state dict (where it shards the weights, ranks other than 0)."""
        module = self.model.module
        if is_peft(module):
            with self.model.gathered():
                return merged_state_dict(module)
        state = self.model.state_dict(copy=False)
        frozen = {name for name, p in module.named_parameters() if not p.requires_grad}
        if frozen and state is not None:  # a frozen part (a VLM's vision tower) never changes: the engines keep theirs
            state = {name: value for name, value in state.items() if name not in frozen}
        return state

    def reload_engine(self) -> None:
        """After a training step: an in-rank engine that keeps weights of its own (not ``shares_trained_weights``)
        loads this rank's, whole on every rank (the core refused a sharding backend for it)."""
        self.engine.load_weights(self._synced_state())

    def weight_sync_call(self, transport: Any, method: str, *args: Any) -> Any:
        """The weight-sync transport's actor-side ``method(source, *args)``, in every rank (see
        :class:`rlhf.components.WeightSyncTransport`); ``source`` keeps the transport's state between calls."""

        if not hasattr(self, "_sync_state"):
            self._sync_state: dict[str, Any] = {}
        return getattr(transport, method)(ActorWeights(self, self._sync_state), *args)

    @while_awake
    def save_checkpoint(self, directory: str) -> None:
        self.model.save_checkpoint(directory, tag="actor")
        if self.ema is not None:
            self.ema.save(Path(directory) / "actor_ema", self.rank, self.world_size)

    @while_awake
    def load_checkpoint(self, directory: str, writer: str | None = None) -> None:
        self._load_checkpoint(directory, "actor", writer)
        if self.ema is not None:
            self.ema.load(Path(directory) / "actor_ema", self.rank, self.world_size)

    def save_hf(self, directory: str) -> None:
        """The trained model (its EMA with ``--train.enable_ema``) and its tokenizer as an HF model dir;
        every rank calls this (the gather is collective), rank 0 writes, through a staging dir so no
        file is half-written."""
        import contextlib

        from transformers import AutoTokenizer

        with self.ema.applied() if self.ema is not None else contextlib.nullcontext():
            state = self.model.state_dict()
        if self.rank == 0:
            with published(Path(directory), "model") as staging, without_deepspeed_import():
                self.model.module.save_pretrained(staging, state_dict=state)
                AutoTokenizer.from_pretrained(self.config.actor.model_name_or_path).save_pretrained(staging)
