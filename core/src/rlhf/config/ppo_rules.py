"""Cross-flag rules and post-parse rewrites of ``rlhf train ppo`` (OpenRLHF 0.11 semantics).

Rules that depend on the chosen components read the components' declared traits
(e.g. ``min_samples_per_prompt``) instead of hard-coding algorithm names, so a new
estimator plugin gets the right checks by declaring its traits.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

from rlhf.components import build
from rlhf.config.base import ConfigError
from rlhf.config.checks import (
    check_4bit,
    check_global_batch,
    check_optimizer,
    colocation_sets,
    engines_colocated_with,
    require_positive,
)
from rlhf.config.ppo import PPOConfig
from rlhf.host.plugin_host import PluginHost
from rlhf.registry import ComponentKind

if TYPE_CHECKING:
    from rlhf.components import RolloutCorrection
    from rlhf.registry import ComponentRegistry

log = logging.getLogger("rlhf.config")


_DP_SOURCE = "--{group}.num_nodes x --{group}.num_gpus_per_node / (--ds.ring_attn_size x --ds.tensor_parallel_size)"


def data_parallel_size(cfg: PPOConfig, group: str) -> int:
    """Ranks of ``group`` (actor or critic) over the ranks one sequence is split across (ring attention x TP)."""
    section = getattr(cfg, group)
    ranks = section.num_nodes * section.num_gpus_per_node
    split = cfg.ds.ring_attn_size * cfg.ds.tensor_parallel_size
    if ranks < split:
        raise ConfigError(f"--ds.ring_attn_size x --ds.tensor_parallel_size = {split} is more than the {group}'s {ranks} "
                          f"rank(s) (--{group}.num_nodes x --{group}.num_gpus_per_node)")
    return ranks // split


def finalize_ppo_config(cfg: PPOConfig, host: PluginHost) -> PPOConfig:
    """Apply OpenRLHF's rewrites and reject invalid flag combinations (clear errors)."""
    require_positive(cfg, "train.batch_size", "train.micro_batch_size", "train.max_epochs", "train.num_episodes",
                     "rollout.batch_size", "rollout.micro_batch_size", "rollout.n_samples_per_prompt",
                     "rollout.max_new_tokens", "data.max_len", "eval.n_samples_per_prompt", "ds.ring_attn_size",
                     "ds.tensor_parallel_size",
                     *(f"{group}.{field}" for group in ("actor", "critic", "ref", "reward")
                       for field in ("num_nodes", "num_gpus_per_node")))
    n = cfg.rollout.n_samples_per_prompt
    if cfg.actor.eps_clip_low_high is None:
        cfg.actor.eps_clip_low_high = [cfg.actor.eps_clip, cfg.actor.eps_clip]
    # OpenRLHF: an agent file implies the multi-turn executor, whose environment gives the rewards
    # (the controller looks the name up: an unknown one is an error listing the installed executors)
    if cfg.train.agent_executor is None:
        cfg.train.agent_executor = "multi_turn" if cfg.train.agent_func_path else "single_turn"

    estimator_name = cfg.algo.advantage.estimator
    estimator = host.registry.get(ComponentKind.ADVANTAGE_ESTIMATOR, estimator_name, flag="--algo.advantage.estimator")
    min_n = getattr(estimator, "min_samples_per_prompt", 1)
    if n < min_n:
        raise ConfigError(
            f"--algo.advantage.estimator {estimator_name} compares samples of the same prompt and needs "
            f"--rollout.n_samples_per_prompt >= {min_n} (got {n})"
        )
    if getattr(estimator, "forces_unit_gamma", False) and cfg.algo.advantage.gamma != 1.0:
        log.warning(
            "--algo.advantage.gamma %s is ignored: estimator %s uses gamma = 1", cfg.algo.advantage.gamma, estimator_name
        )
        cfg.algo.advantage.gamma = 1.0
    needs_critic = bool(getattr(estimator, "needs_critic", False))
    if needs_critic and cfg.critic.model_name_or_path is None:
        rm_paths = (cfg.reward.model_name_or_path or "").split(",")
        cfg.critic.model_name_or_path = rm_paths[0] if rm_paths[0] else cfg.actor.model_name_or_path

    if cfg.data.max_images_per_prompt > 0:
        if needs_critic:
            raise ConfigError(
                f"vision-language training (--data.max_images_per_prompt > 0) has no critic support; "
                f"choose an estimator without a critic instead of --algo.advantage.estimator {estimator_name}"
            )
        if cfg.ds.packing_samples:
            raise ConfigError("--ds.packing_samples is not supported with --data.max_images_per_prompt > 0")
        if cfg.reward.model_name_or_path:
            raise ConfigError("--reward.model_name_or_path with --data.max_images_per_prompt > 0: reward models do not "
                              "see the images; score with --reward.remote_url (a reward_func file or a remote reward)")
    if cfg.ds.ring_attn_size > 1 and not cfg.ds.packing_samples:
        log.warning("--ds.ring_attn_size > 1 splits packed rows across ranks: enabling --ds.packing_samples")
        cfg.ds.packing_samples = True

    _resolve_scheduler(cfg, host)
    colocation_sets(cfg.train.colocate)  # a bad --train.colocate is one line before anything starts
    check_sleep(cfg)
    if cfg.ds.enable_sleep and cfg.ds.adam_offload:
        log.warning("--ds.enable_sleep with --ds.adam_offload: the optimizer states live on the CPU already; nothing to offload")
    if cfg.train.partial_rollout_enable and not cfg.train.async_enable:
        raise ConfigError("--train.partial_rollout_enable requires --train.async_enable")

    if cfg.ckpt.best_metric_key and not (cfg.eval.dataset and cfg.eval.steps > 0):
        raise ConfigError("--ckpt.best_metric_key ranks evaluations: set --eval.dataset and --eval.steps too")
    remote_reward = bool(cfg.reward.remote_url or cfg.reward.functions or _executor_rewards(cfg, host))
    sources = "set --reward.functions, --reward.remote_url or --train.agent_func_path (or an agent executor whose environment rewards)"
    if cfg.eval.dataset and not remote_reward:
        raise ConfigError(f"--eval.dataset needs a rule or remote reward: {sources}")
    if cfg.algo.dynamic_filtering_enable:
        if not remote_reward:
            raise ConfigError(f"--algo.dynamic_filtering_enable filters on rule/remote scores: {sources}")
        if n < 2:
            raise ConfigError(f"--algo.dynamic_filtering_enable needs --rollout.n_samples_per_prompt >= 2 (got {n})")

    if cfg.rollout.vllm_generate_batch_size is None:
        cfg.rollout.vllm_generate_batch_size = cfg.rollout.batch_size
    elif cfg.rollout.vllm_generate_batch_size > cfg.rollout.batch_size and not cfg.train.async_enable:
        raise ConfigError(
            f"--rollout.vllm_generate_batch_size {cfg.rollout.vllm_generate_batch_size} > --rollout.batch_size "
            f"{cfg.rollout.batch_size} requires --train.async_enable"
        )

    for group in ("actor", "critic") if needs_critic else ("actor",):
        section = getattr(cfg, group)
        optimizer = build(host.registry.get(ComponentKind.OPTIMIZER, section.optim, flag=f"--{group}.optim"), cfg)
        check_optimizer(optimizer, section, lambda field, group=group: f"--{group}.{field}")

    actor_dp = data_parallel_size(cfg, "actor")
    check_global_batch(cfg.train.batch_size, cfg.train.micro_batch_size, actor_dp, _DP_SOURCE.format(group="actor"))
    if needs_critic:
        check_global_batch(cfg.train.batch_size, cfg.train.micro_batch_size, data_parallel_size(cfg, "critic"),
                           _DP_SOURCE.format(group="critic"))
    micro_batches = n * cfg.rollout.batch_size // cfg.rollout.micro_batch_size
    if micro_batches < actor_dp:
        raise ConfigError(
            f"--rollout.n_samples_per_prompt x --rollout.batch_size / --rollout.micro_batch_size = {micro_batches} "
            f"is smaller than the actor's data-parallel size {actor_dp} ({_DP_SOURCE.format(group='actor')}): "
            "raise the rollout batch or lower the actor's device count"
        )

    active_correction(cfg, host.registry)  # its options' errors, in the CLI process

    if cfg.vllm.sync_backend != "auto":  # whether it can run for this config: the controller's input check
        host.registry.registration(ComponentKind.WEIGHT_SYNC_TRANSPORT, cfg.vllm.sync_backend, flag="--vllm.sync_backend")
    if cfg.ds.load_in_4bit:
        check_4bit(cfg.ds, devices_here=not os.environ.get("RAY_ADDRESS"))
    kl = cfg.algo.kl
    if kl.init_coef > 0:
        if not kl.use_loss and kl.estimator != "k1":
            log.warning("KL in the reward works best with --algo.kl.estimator k1 (got %s)", kl.estimator)
        if kl.use_loss and kl.estimator == "k1":
            log.warning("KL as a loss works best with --algo.kl.estimator k2 or k3 (got k1)")
    return cfg


def active_correction(config: PPOConfig, registry: ComponentRegistry) -> RolloutCorrection | None:
    """The run's train/rollout correction: the registered one whose flags switch it on, or None. Builds every
    registered correction (their option errors surface here); two active ones are a config error."""
    built = [(reg.name, build(reg.load(), config)) for reg in registry.registrations(ComponentKind.ROLLOUT_CORRECTION)]
    active = [(name, correction) for name, correction in built if correction.active]
    if len(active) > 1:
        raise ConfigError(f"rollout corrections {', '.join(name for name, _ in active)} are all switched on: "
                          "a policy loss takes one coefficient; switch off all but one")
    return active[0][1] if active else None


def _resolve_scheduler(cfg: PPOConfig, host: PluginHost) -> None:
    """``--train.rollout_scheduler``: ``auto`` keeps OpenRLHF's ``--train.async_enable``; a named scheduler that
    generates ahead sets it, as the CPU placement reads it."""
    train = cfg.train
    if cfg.rollout.generate_only and (cfg.rollout.replay_dir or train.async_enable):
        flag = "--rollout.replay_dir" if cfg.rollout.replay_dir else "--train.async_enable"
        raise ConfigError(f"--rollout.generate_only trains nothing, and {flag} only changes how a run trains: drop one")
    if cfg.rollout.replay_dir:  # the dump holds what the run trained, however it was generated (an async run's too)
        if train.rollout_scheduler not in ("auto", "replay"):
            raise ConfigError(f"--rollout.replay_dir trains on dumped rollouts, which --train.rollout_scheduler "
                              f"{train.rollout_scheduler} would generate instead: leave it at auto")
        train.rollout_scheduler, train.async_enable, train.partial_rollout_enable = "replay", False, False
    if train.rollout_scheduler == "auto":
        train.rollout_scheduler = "async" if train.async_enable else "sync"
    scheduler = host.registry.get(ComponentKind.ROLLOUT_SCHEDULER, train.rollout_scheduler, flag="--train.rollout_scheduler")
    ahead = bool(getattr(scheduler, "generates_ahead", False))
    if train.async_enable and not ahead:
        raise ConfigError(f"--train.async_enable: the rollout scheduler {train.rollout_scheduler!r} generates each batch "
                          "in turn; leave --train.rollout_scheduler at auto or name one that generates ahead")
    train.async_enable = ahead
    if (check := getattr(scheduler, "check_config", None)) is not None:
        check(cfg)


def _executor_rewards(cfg: PPOConfig, host: PluginHost) -> bool:
    """Whether the run's agent executor rewards its own episodes (``provides_rewards``); an unknown name is the
    controller's error to report, with the installed executors."""
    name = cfg.train.agent_executor
    if name not in host.registry.names(ComponentKind.AGENT_EXECUTOR):
        return False
    return bool(getattr(host.registry.get(ComponentKind.AGENT_EXECUTOR, name), "provides_rewards", False))


def check_sleep(cfg: PPOConfig) -> None:
    """Sleep mode's preconditions (a :class:`ConfigError` otherwise); ``rlhf plan``'s search checks its candidates
    with it too."""
    if cfg.vllm.enable_sleep and engines_colocated_with(cfg.train) is None:
        raise ConfigError("--vllm.enable_sleep only makes sense with --train.colocate_all or a --train.colocate set with "
                          "engines (engines share devices with training)")
    if cfg.ds.enable_sleep and cfg.ds.zero_stage == 0:
        raise ConfigError("--ds.enable_sleep offloads ZeRO optimizer states, which --ds.zero_stage 0 has none of: "
                          "use --ds.zero_stage 1, 2 or 3")
