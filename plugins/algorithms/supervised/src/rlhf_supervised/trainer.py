"""The loop every supervised trainer plugin (sft, rm, dpo, kto, prm, kd) runs.

A plugin subclasses :class:`SupervisedTrainer` and supplies three things: how rows
become examples (:meth:`build_examples`), how examples become a batch
(:meth:`collate`), and the loss of a batch (:meth:`compute`, returning sums over
*units* — tokens or samples — that :meth:`units` counts). The loop owns the rest:
data order, one exact mean per optimizer step across micro-batches and ranks,
the training backend, evaluation, checkpoints and resume, logging, and the final save.

Everything runs in the trainer's process(es), one per device (see
:mod:`rlhf_supervised.models`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import random
import time
from pathlib import Path
from typing import Any, ClassVar, NamedTuple

import rlhf.records.checkpoints as checkpoint
from rlhf.components.first_use import FirstUse
from rlhf.config.base import ConfigError
from rlhf.config.checks import check_4bit, check_global_batch, require_positive
from rlhf.config.training_backend import (
    backend_label,
    check_backend_config,
    converts_from,
    load_trained_checkpoint,
    model_record,
    training_backend,
)
from rlhf.data.sources import load_mixed
from rlhf.data.workers import computed_in_order
from rlhf.distributed import restored_process
from rlhf.errors import Preempted
from rlhf.models.loading import attn_implementation, check_model_source, load_tokenizer, seed_process
from rlhf.models.saving import save_final
from rlhf.planning import ModelGroup, RunGroups
from rlhf.records import preemption
from rlhf.records.checkpoints import interrupted
from rlhf.records.metrics import MetricsTracker
from rlhf_supervised.batch import collate, per_sample_sum, token_logprobs
from rlhf_supervised.config import SupervisedConfig
from rlhf_supervised.models import frozen_model, join_process_group, trained_model

__all__ = ["LossParts", "SupervisedTrainer"]

log = logging.getLogger("rlhf.supervised")


class LossParts(NamedTuple):
    """What :meth:`SupervisedTrainer.compute` returns for one micro-batch.

    ``loss_sum``: scalar tensor, the loss summed over the micro-batch's units. ``metrics``:
    name -> sum over the same units (logged divided by the step's unit count). ``aux``:
    an optional per-forward MoE balancing loss (added as ``--model.aux_loss_coef × mean``).
    """

    loss_sum: Any
    metrics: dict[str, Any]
    aux: Any = None


def _accumulate(sums: dict[str, float], parts: LossParts) -> None:
    """Add one micro-batch's loss and metric sums into ``sums`` (plain floats, off the graph)."""
    for key, value in (("loss", parts.loss_sum), *parts.metrics.items()):
        sums[key] = sums.get(key, 0.0) + float(value.detach() if hasattr(value, "detach") else value)


class SupervisedTrainer:
    """Base of the supervised trainers; see the module docstring for the contract."""

    config_class: ClassVar[type[SupervisedConfig]] = SupervisedConfig
    #: None: a causal LM is trained; a name: a value model whose head has that attribute name.
    value_head: ClassVar[str | None] = None
    #: Config sections naming evaluated-only models (``ref``, ``teacher``), loaded into ``self.frozen``.
    frozen_sections: ClassVar[tuple[str, ...]] = ()
    shown_metrics: ClassVar[tuple[str, ...]] = ("loss",)

    def __init__(self, config: SupervisedConfig, plugins: Any, run_dir: Path) -> None:
        self.config, self.plugins, self.run_dir = config, plugins, Path(run_dir)
        self.frozen: dict[str, Any] = {}
        self.rank, self.world_size = 0, 1
        #: data-parallel rank and size: the ranks of one --ds.tensor_parallel_size group share the same data
        self.dp_rank, self.dp_size = 0, 1
        self.tokenizer: Any = None

    @classmethod
    def plan_groups(cls, config: SupervisedConfig, registry: Any) -> RunGroups:
        """For ``rlhf plan``: the trained model and the frozen ones (``frozen_sections``), all in every rank, one
        rank per GPU (docs/plan.md)."""
        path = config.model.model_name_or_path
        if not path:
            raise ConfigError("--model.model_name_or_path is required")
        train = config.train
        models = [ModelGroup("model", path, "--model.model_name_or_path", 0, True, cls.value_head is not None, train,
                             train.gradient_checkpointing_enable)]
        for name in cls.frozen_sections:
            section = getattr(config, name)
            models.append(ModelGroup(name, section.model_name_or_path or path, f"--{name}.model_name_or_path", 0, False,
                                     section=section))
        return RunGroups(models, per_device=True)

    @classmethod
    def prepare_config(cls, config: SupervisedConfig, plugins: Any) -> SupervisedConfig:
        """Cross-flag checks in the CLI process before anything loads; subclasses extend it (call super)."""
        import os

        require_positive(config, "train.batch_size", "train.micro_batch_size", "train.max_epochs", "data.max_len",
                         "ds.tensor_parallel_size")
        # under torchrun / the deepspeed launcher the ranks form groups of --ds.tensor_parallel_size
        world, tp = int(os.environ.get("WORLD_SIZE", "1")), config.ds.tensor_parallel_size
        if world % tp:
            raise ConfigError(f"--ds.tensor_parallel_size {tp} does not divide the launcher's WORLD_SIZE {world}")
        check_global_batch(config.train.batch_size, config.train.micro_batch_size, world // tp,
                           "the launcher's WORLD_SIZE / --ds.tensor_parallel_size")

        groups = None  # every group in every rank of the launch; without a model path the run is refused later
        if config.model.model_name_or_path:
            groups = [dataclasses.replace(group, ranks=world, ranks_from="the launcher's WORLD_SIZE")
                      for group in cls.plan_groups(config, plugins.registry).models]
        check_backend_config(config, plugins.registry, groups)
        if config.ds.load_in_4bit:

            check_4bit(config.ds)
        return config

    # ----- the trainer plugin's part -------------------------------------------------
    def build_examples(self, rows: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
        """Rows -> examples, each with a ``length`` (its longest token sequence). Runs once per dataset."""
        raise NotImplementedError

    def collate(self, examples: list[dict[str, Any]]) -> Any:
        """Examples -> one micro-batch (a :class:`~rlhf_supervised.batch.SupervisedBatch` by default)."""

        return collate([e["ids"] for e in examples], [e["mask"] for e in examples], self.pad_id,
                       self.config.ds.packing_samples)

    def units(self, batch: Any) -> float:
        """How many units the loss of ``batch`` is a sum over (default: trained tokens)."""
        return float(batch.loss_mask.sum())

    def compute(self, batch: Any, training: bool) -> LossParts:
        """The loss of one micro-batch, with ``self.model`` (a :class:`rlhf.components.TrainedModel`; and
        ``self.frozen``) on ``self.device``."""
        raise NotImplementedError

    def setup(self) -> None:
        """Called once per trainer process after the trained and frozen models are loaded, before
        resume and the first step (cross-model checks, e.g. a teacher's vocabulary)."""

    def step_finished(self, metrics: dict[str, float]) -> dict[str, float]:
        """Called after every optimizer step with its averaged metrics (rank 0 logs them); returns what to log."""
        return metrics

    def eval_finished(self, metrics: dict[str, float]) -> dict[str, float]:
        """Called after every evaluation with its averaged metrics; returns what to log."""
        return metrics

    def final_config_updates(self) -> dict[str, Any]:
        """Keys written into the saved model's ``config.json`` (the RM's reward statistics)."""
        return {}

    # ----- helpers for plugins ---------------------------------------------------------
    @property
    def pad_id(self) -> int:
        return self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.tokenizer.eos_token_id

    def forward(self, model: Any, batch: Any) -> Any:
        """The HF forward of a batch (asks MoE models for their balancing loss when it is used)."""
        extra = {"output_router_logits": True} if self.config.model.aux_loss_coef > 0 else {}
        return model(**batch.model_inputs(), **extra)

    def sequence_logprobs(self, model: Any, batch: Any) -> tuple[Any, Any]:
        """``((N,) Σ log p over each sample's trained tokens, forward output)``; under no_grad for frozen models."""
        import torch

        frozen = model is not self.model
        with torch.no_grad() if frozen else contextlib.nullcontext():
            out = self.forward(model, batch)
            return per_sample_sum(token_logprobs(out.logits, batch), batch), out

    # ----- the loop ---------------------------------------------------------------------
    def run(self) -> None:
        """The run, in this process; afterwards the process is as it was (:func:`rlhf.distributed.restored_process`),
        so that a later run in it (a test, a notebook) starts as a new process would."""
        with restored_process():
            self._run()

    def _run(self) -> None:
        import torch

        cfg = self.config
        if not cfg.model.model_name_or_path:
            raise ConfigError("--model.model_name_or_path is required")
        check_model_source(cfg.model.model_name_or_path, "--model.model_name_or_path")
        self.backend = training_backend(cfg, self.plugins.registry)
        # the backend's set-up and model loads are where the library under it refuses the run (one line, exit 2);
        # what this package or the trainer's raises itself stays a bug
        setup = FirstUse(backend_label(cfg, self.plugins.registry), type(self.backend),
                         callers=("rlhf_supervised", type(self).__module__.split(".")[0]))
        with setup.watch("init_distributed", "while it joined the distributed group"):
            self.rank, self.world_size = join_process_group(self.backend, cfg.local_rank)
        seed_process(cfg.train.seed, cfg.train.full_determinism_enable)
        tp = cfg.ds.tensor_parallel_size  # DeepSpeed AutoTP groups consecutive ranks
        self.dp_rank, self.dp_size = self.rank // tp, self.world_size // tp
        self.tokenizer = load_tokenizer(cfg.model.model_name_or_path, "--model.model_name_or_path",
                                        use_fast=not cfg.data.disable_fast_tokenizer)
        if cfg.data.tokenizer_chat_template:
            self.tokenizer.chat_template = cfg.data.tokenizer_chat_template
        train, evaluation = self._datasets()
        self.train_examples, self.eval_examples = train, evaluation
        self.steps_per_epoch = len(train) // cfg.train.batch_size
        if self.steps_per_epoch == 0:
            raise ConfigError(f"--data.dataset has {len(train)} usable samples, fewer than --train.batch_size {cfg.train.batch_size}")
        total = self.steps_per_epoch * cfg.train.max_epochs
        with setup.watch("trained", "while it loaded the model for training"):
            self.model = trained_model(self.backend, cfg, self.plugins, self.dp_size, total, value_head=self.value_head)
        self.device = self.model.device
        if cfg.ds.packing_samples and self.rank == 0:

            if not attn_implementation(cfg.ds.attn_implementation).startswith("flash"):
                log.warning("--ds.packing_samples without flash-attn: the packed row gets a full block-diagonal mask, "
                            "so attention costs grow with the square of the packed length (measured slower than "
                            "padding on CPU, see benchmarks/sft_packing.py); it pays off with flash_attention_2 on GPU")
        for name in self.frozen_sections:
            section = getattr(cfg, name)
            with setup.watch(name, f"while it loaded the {name} model"):
                self.frozen[name] = frozen_model(self.backend, cfg, section.model_name_or_path or cfg.model.model_name_or_path,
                                                 section.offload)
        self.setup()
        step = self._resume()
        tracker = self._tracker(total, step)
        status = "failed"

        # --data.dataloader_num_workers: the next steps' micro-batches are collated in worker processes
        step_batches = computed_in_order(self._step_batches, range(step, total), cfg.data.dataloader_num_workers)
        try:
            self.plugins.train_start(cfg, self.run_dir)
            while step < total:
                torch.manual_seed(cfg.train.seed * 1000003 + step)  # dropout etc.: resumes replay exactly
                metrics = self._train_step(step, next(step_batches))
                step += 1
                if step == total or (cfg.eval.steps > 0 and step % cfg.eval.steps == 0):
                    metrics.update(self.evaluate())  # the final eval shares the last step's record: each step once
                # logged before the checkpoint: a resume from it keeps every line up to its step
                if tracker is not None:
                    tracker.log(step, metrics)
                saved = None
                if cfg.ckpt.save_steps > 0 and step % cfg.ckpt.save_steps == 0:
                    saved = self.save_checkpoint(step)
                self.plugins.step_end(step, metrics)
                # a preemption signal during this step (--ckpt.preemption_signals): its checkpoint, then Preempted;
                # every rank saves and stops at the same step when any rank got the signal
                preemption.step_done(step, lambda saved=saved, step=step: saved or self.save_checkpoint(step),
                                     agree=self._any_rank if self.world_size > 1 else None)

            save_final(self.model, self.tokenizer, Path(cfg.ckpt.output_dir), self.rank, self.final_config_updates())
            status = "completed"
        except Preempted:  # its checkpoint is written: the CLI names it
            status = "preempted"
            raise
        except KeyboardInterrupt as exc:  # Ctrl-C, or a signal that stops at once: say what there is to resume from

            status = "interrupted"
            raise interrupted(Path(cfg.ckpt.path)) from exc
        finally:
            if tracker is not None:
                tracker.close()
            self.plugins.train_end(cfg, self.run_dir, status)

    def _datasets(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        cfg = self.config
        rows = load_mixed(cfg.data.dataset, cfg.data.dataset_probs, cfg.data.dataset_split, cfg.data.max_samples,
                          cfg.train.seed, "--data.dataset", "--data.dataset_probs")
        eval_rows: list[dict[str, Any]] = []
        if cfg.eval.dataset:
            eval_rows = load_mixed(cfg.eval.dataset, None, cfg.eval.split, cfg.data.max_samples, cfg.train.seed,
                                   "--eval.dataset", "--eval.dataset")
        elif cfg.eval.holdout > 0:
            order = list(range(len(rows)))
            random.Random(cfg.train.seed).shuffle(order)
            cut = max(1, int(len(rows) * cfg.eval.holdout))
            eval_rows, rows = [rows[i] for i in order[:cut]], [rows[i] for i in order[cut:]]
        return (self._usable(self.build_examples(rows, cfg.data.dataset), "--data.dataset"),
                self._usable(self.build_examples(eval_rows, cfg.eval.dataset or "holdout"), "--eval.dataset"))

    def _usable(self, examples: list[dict[str, Any]], flag: str) -> list[dict[str, Any]]:
        kept = [e for e in examples if e["length"] <= self.config.data.max_len]
        if len(kept) < len(examples) and self.rank == 0:
            log.warning("%s: dropped %d of %d samples longer than --data.max_len %d", flag, len(examples) - len(kept),
                        len(examples), self.config.data.max_len)
        return kept

    def _step_examples(self, step: int) -> list[dict[str, Any]]:
        """This rank's share of optimizer step ``step``: a seeded shuffle per epoch, so resumes match."""
        size = self.config.train.batch_size
        epoch, index = divmod(step, self.steps_per_epoch)
        order = list(range(len(self.train_examples)))
        random.Random(self.config.train.seed * 7919 + epoch).shuffle(order)
        chosen = order[index * size : (index + 1) * size]
        per_rank = size // self.dp_size
        return [self.train_examples[i] for i in chosen[self.dp_rank * per_rank : (self.dp_rank + 1) * per_rank]]

    def _step_batches(self, step: int) -> list[Any]:
        """This rank's micro-batches of optimizer step ``step``."""
        return self._micro_batches(self._step_examples(step))

    def _micro_batches(self, examples: list[dict[str, Any]]) -> list[Any]:
        micro = self.config.train.micro_batch_size
        return [self.collate(examples[i : i + micro]) for i in range(0, len(examples), micro)]

    def _all_reduce(self, values: list[float]) -> list[float]:
        import torch

        tensor = torch.tensor(values, dtype=torch.float64, device=self.device)  # NCCL reduces no CPU tensor
        if self.world_size > 1:
            torch.distributed.all_reduce(tensor)
        return (tensor / (self.world_size // self.dp_size)).tolist()  # a tensor-parallel group's ranks hold the same sums

    def _train_step(self, step: int, batches: list[Any]) -> dict[str, float]:
        """One optimizer step over this rank's micro-batches of it: the loss is Σ loss_sum / Σ units over
        every micro-batch of every rank."""
        started = time.perf_counter()
        tokens = sum(int((b.sample_ids >= 0).sum()) for b in batches)  # real tokens, padding excluded
        (total_units,) = self._all_reduce([sum(self.units(b) for b in batches)])
        total_units = max(total_units, 1.0)
        # the backend divides each micro-batch's loss by the accumulation steps and averages ranks: undo both.
        scale = float(self.model.accumulation_steps() * self.dp_size)
        sums: dict[str, float] = {}
        aux = [0.0, 0.0]  # Σ aux loss, forwards that reported one
        self.model.train()
        for batch in batches:
            parts = self.compute(batch.to(self.device), training=True)
            loss = parts.loss_sum / total_units * scale
            if parts.aux is not None and self.config.model.aux_loss_coef > 0:
                loss = loss + self.config.model.aux_loss_coef * parts.aux
                aux = [aux[0] + float(parts.aux.detach()), aux[1] + 1]
            self.model.backward(loss)
            self.model.step()
            _accumulate(sums, parts)
        keys = sorted(sums)
        *reduced, aux_total, aux_count = self._all_reduce([sums[k] for k in keys] + aux)
        metrics = self.step_finished({k: v / total_units for k, v in zip(keys, reduced)})
        if aux_count:
            metrics["aux_loss"] = aux_total / aux_count
        metrics["lr"] = self.model.learning_rate()
        elapsed = time.perf_counter() - started
        (all_tokens,) = self._all_reduce([float(tokens)])
        metrics.update({"timing/step": elapsed, "throughput/tokens_per_s": all_tokens / max(elapsed, 1e-9)})
        return metrics

    def evaluate(self, examples: list[dict[str, Any]] | None = None) -> dict[str, float]:
        """Average loss and metrics over ``examples`` (default: the eval examples) on all ranks;
        ``{}`` without eval data."""
        import torch

        examples = self.eval_examples if examples is None else examples
        if not examples:
            return {}
        # equal shares: under ZeRO-3 every forward is collective, so ranks must run the same micro-batches
        usable = len(examples) - len(examples) % self.dp_size
        mine = examples[:usable][self.dp_rank :: self.dp_size]
        sums: dict[str, float] = {"loss": 0.0}
        units = 0.0
        self.model.eval()
        with torch.no_grad():
            for batch in self._micro_batches(mine):
                units += self.units(batch)
                parts = self.compute(batch.to(self.device), training=False)
                _accumulate(sums, parts)
        keys = sorted(sums)
        reduced = self._all_reduce([units] + [sums[k] for k in keys])
        averaged = {k: v / max(reduced[0], 1.0) for k, v in zip(keys, reduced[1:])}
        return {f"eval/{k}": v for k, v in self.eval_finished(averaged).items()}

    # ----- checkpoints --------------------------------------------------------------------
    def _any_rank(self, asked: bool) -> bool:
        (count,) = self._all_reduce([float(asked)])
        return count > 0

    def save_checkpoint(self, step: int) -> Path:
        """Every rank writes its training states into one staging dir that rank 0 commits; returns its final path."""
        import torch.distributed as dist

        plugin_state: dict[str, Any] = {}
        state = {"step": step, "plugin_set": self.config.plugin_set, "plugins": plugin_state,
                 "models": self._trained_models(), "config": self.config.model_dump(mode="json")}

        def write(staging: Path) -> None:
            self.model.save_checkpoint(str(staging), tag="model")
            self.plugins.checkpoint_save(step, staging, plugin_state)

        return checkpoint.save(Path(self.config.ckpt.path), step, state, write, self.config.ckpt.max_num,
                               max_gb=self.config.ckpt.max_mem, rank=self.rank, barrier=dist.barrier)

    def _resume(self) -> int:
        """``--ckpt.load_enable``: the step of the checkpoint loaded (0 when there is none)."""

        if not self.config.ckpt.load_enable:
            return 0

        cfg, registry = self.config, self.plugins.registry

        def load(directory: Path, state: dict[str, Any]) -> None:
            writer = state.get("models", {}).get("model", {}).get("backend")
            load_trained_checkpoint(cfg, self.backend, self.model, writer, directory, "model", registry)
            self.plugins.checkpoint_load(state["step"], directory, state.get("plugins", {}))

        state = checkpoint.resume(Path(cfg.ckpt.path), load, models=self._trained_models(),
                                  converts=converts_from(cfg, registry))
        return state["step"] if state is not None else 0

    def _trained_models(self) -> dict[str, dict[str, Any]]:
        """What a checkpoint records of the trained model (rlhf.records.checkpoint_fit)."""
        cfg = self.config
        return {"model": model_record(cfg, self.plugins.registry, self.world_size, cfg.model.model_name_or_path)}

    def _tracker(self, total: int, step: int) -> Any:
        if self.rank != 0:
            return None
        import yaml

        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "rlhf_config.yaml").write_text(yaml.safe_dump(self.config.model_dump(mode="json"), sort_keys=False))
        return MetricsTracker(self.config, self.run_dir, total, step, desc="steps", shown=self.shown_metrics)
