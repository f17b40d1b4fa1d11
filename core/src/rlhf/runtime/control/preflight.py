"""What ``rlhf train ppo`` checks of the user's inputs before any worker runs: the model directories, the engine and
weight-sync transport it can use here, the checkpoint it would resume, the tokenizer and every prompt row."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlhf.config.base import ConfigError
from rlhf.config.rollout_engine import rollout_engine_class, rollout_engine_name, uses_engine
from rlhf.config.training_backend import converts_from
from rlhf.data.prompts import build_prompts, load_prompt_rows, prompt_processor
from rlhf.data.sourced import run_schedule
from rlhf.models.extensions import active
from rlhf.models.loading import check_model_source, checkpoint_sampling_defaults, load_tokenizer
from rlhf.records import checkpoints as checkpoint
from rlhf.records.checkpoint_fit import check_fit
from rlhf.registry import ComponentKind as K
from rlhf.runtime.cluster.local import ranks_in_process
from rlhf.runtime.control.checkpointing import RESUMED_KEYS
from rlhf.runtime.sync.weights import transport_before_ray

if TYPE_CHECKING:
    from rlhf.config.ppo import PPOConfig
    from rlhf.registry import ComponentRegistry

log = logging.getLogger("rlhf.runtime")


@dataclass(frozen=True)
class RunSources:
    """What the checks of the sources decide the run goes on with."""

    #: the rollout engine's class (None: the run generates nothing, it replays dumped rollouts)
    engine_class: type | None
    #: the engine generates inside the actor's ranks (or there is none): nothing beside the ranks, nothing to sync
    engine_in_rank: bool
    #: the weight-sync transport as far as it is known before Ray starts (None: no engine process to sync into)
    transport: str | None
    #: the model ranks run in the CLI's own process (``--train.in_process``)
    in_process: bool


@dataclass(frozen=True)
class RunData:
    """The run's prompts, read and tokenized: what the steps and evaluations draw from."""

    tokenizer: Any
    #: the prompt schedule (rlhf.components.RolloutLoop.schedule)
    schedule: Any
    #: the names of the prompt sources, which steering's prompt mix weighs
    prompt_sources: tuple[str, ...]
    eval_prompts: list[dict[str, Any]]


class PPOPreflight:
    """The checks of one ``rlhf train ppo`` run, in the CLI process. They read the run's config, the component
    registry, whether the estimator trains a critic, the reward models' paths and what a checkpoint records of the
    trained groups (``models``: :func:`rlhf.runtime.control.checkpointing.trained_models`); they return what the run
    goes on with: :class:`RunSources`, then :class:`RunData`."""

    def __init__(self, config: PPOConfig, registry: ComponentRegistry, *, critic: bool, reward_model_paths: list[str],
                 models: dict[str, dict[str, Any]]) -> None:
        self.config, self.registry, self.critic = config, registry, critic
        self.reward_model_paths, self.models = reward_model_paths, models

    def check_sources(self) -> RunSources:
        """Model directories and the resumed ``state.json``, in the CLI process before Ray starts, so a
        wrong path costs one line and a second. Caps ``--data.max_len`` at the actor's positions."""

        cfg, registry = self.config, self.registry
        # an engine that is not installed fails before Ray starts, and so does a --vllm.sync_backend that cannot run here;
        # a run that generates nothing (replayed rollouts) has no engine: nothing beside the ranks, nothing to sync
        generates = uses_engine(cfg, registry)
        engine_class = rollout_engine_class(cfg, registry) if generates else None
        engine_in_rank = engine_class is None or engine_class.in_training_rank
        transport = transport_before_ray(cfg, registry) if generates else None
        if generates and engine_in_rank and cfg.vllm.sync_backend != "auto":
            log.warning("--vllm.sync_backend %s is not used: the rollout engine generates inside the actor's ranks with "
                        "the trained weights, so there is nothing to sync", cfg.vllm.sync_backend)
        if cfg.rollout.dump_dir:
            _check_writable_dir(Path(cfg.rollout.dump_dir), "--rollout.dump_dir")
        actor_path = cfg.actor.model_name_or_path
        if not actor_path:
            raise ConfigError("--actor.model_name_or_path is required")
        positions = getattr(check_model_source(actor_path, "--actor.model_name_or_path"), "max_position_embeddings", None)
        if positions and positions < cfg.data.max_len:  # engines cap there anyway: filter prompts by the real limit
            log.warning("--data.max_len %d is more than the actor's max_position_embeddings %d: using %d",
                        cfg.data.max_len, positions, positions)
            cfg.data.max_len = positions
        if generates and not getattr(engine_class, "records_token_values", False):
            asking = next(filter(None, (getattr(e, "needs_engine_records", None) for e in active(cfg, registry))), None)
            if asking:  # e.g. MoE routing replay beside an engine that cannot say which experts it chose
                raise ConfigError(f"{asking}: the rollout engine {rollout_engine_name(cfg, registry)!r} "
                                  "records no per-token values for the trainer (its class does not set "
                                  "records_token_values), so the trainer would have nothing to follow; use --rollout.engine "
                                  "hf-inprocess or hf, which record them, or drop the flag")
        if generates and (ignored := checkpoint_sampling_defaults(actor_path)):
            settings = ", ".join(f"{key}={value}" for key, value in ignored.items())
            log.warning("%s/generation_config.json sets %s: the rollout engine ignores these and samples the policy "
                        "itself at --rollout.temperature %g and --rollout.top_p %g, as the trainer's log-probs assume",
                        actor_path.rstrip("/"), settings, cfg.rollout.temperature, cfg.rollout.top_p)
        if self.critic and cfg.critic.model_name_or_path != actor_path:
            check_model_source(cfg.critic.model_name_or_path, "--critic.model_name_or_path")
        for path in self.reward_model_paths:
            check_model_source(path, "--reward.model_name_or_path")
        if cfg.ckpt.load_enable and (found := checkpoint.checkpoints(Path(cfg.ckpt.path))):
            state = checkpoint.load_state(found[-1][1], RESUMED_KEYS)  # a damaged state.json, before any worker starts
            # and one that fits another run (or that this run's backend converts from the one that wrote it)
            check_fit(found[-1][1], state, self.models, converts_from(cfg, registry))
        # ranks beside engine processes need a transport that serves them there, and a cluster without GPUs (_run)
        serves = transport is not None and getattr(registry.get(K.WEIGHT_SYNC_TRANSPORT, transport),
                                                   "serves_in_process_actor", False)
        in_process = ranks_in_process(cfg, engine_in_rank, critic=self.critic,
                                      reward_models=bool(self.reward_model_paths), beside_engines=serves)
        return RunSources(engine_class, engine_in_rank, transport, in_process)

    def read_data(self) -> RunData:
        """The tokenizer and every prompt row (the CLI process; the rows' errors name file and row)."""

        cfg = self.config
        tokenizer = load_tokenizer(cfg.actor.model_name_or_path, "--actor.model_name_or_path",
                                   use_fast=not cfg.data.disable_fast_tokenizer)
        processor = prompt_processor(cfg, self.registry)
        schedule, prompt_sources = run_schedule(cfg, tokenizer, self.registry, processor)
        eval_prompts: list[dict[str, Any]] = []
        if cfg.eval.dataset:
            eval_data = cfg.data.model_copy(update={"prompt_dataset": cfg.eval.dataset, "prompt_split": cfg.eval.split,
                                                     "prompt_probs": None})
            eval_prompts = build_prompts(load_prompt_rows(eval_data, cfg.train.seed), eval_data, tokenizer,
                                         cfg.eval.dataset, processor=processor)
        return RunData(tokenizer, schedule, prompt_sources, eval_prompts)


def _check_writable_dir(directory: Path, flag: str) -> None:
    """``directory`` is one, or can be made: neither it nor a folder above it is a file (else the run would stop
    at its first write with the library's FileExistsError)."""
    existing = next(path for path in (directory, *directory.absolute().parents) if path.exists())
    if not existing.is_dir():
        raise ConfigError(f"{flag} {directory}: {existing} is a file, not a directory; name a directory "
                          "(one that does not exist is made)")
