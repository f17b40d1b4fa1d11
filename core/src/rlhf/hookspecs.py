"""Every hook a plugin can implement.

Two families:

* **Registration hooks** (``rlhf_register_*``) receive a typed :class:`~rlhf.registry.Register`
  and contribute named components. The host calls each plugin's implementation
  separately, so a duplicate name or an exception blames exactly one plugin.
  They run in every process that loads plugins (the CLI, the controller and every
  Ray worker), once per process, at plugin load; they must be cheap (register lazy
  ``"module:attr"`` strings) and idempotent.
* **Lifecycle hooks** serve loggers and observers. They are broadcast to every
  plugin; none of them runs per token or per micro-batch (hot-loop work lives in
  the selected components' methods).

Each docstring says *when* the hook runs, *in which process*, *how often*, and the
shapes of any tensors it sees. ``tests/test_hook_docs.py`` fails when a hook lacks
that documentation or a test named ``test_hook_<name>``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlhf import hookspec

if TYPE_CHECKING:
    from rlhf.components import (
        AdvantageEstimator,
        AgentExecutor,
        Command,
        KLEstimator,
        ModelLoader,
        OptimizerFactory,
        PolicyLoss,
        Processor,
        PromptSource,
        RewardFunction,
        RewardManager,
        RewardShaper,
        RolloutCorrection,
        RolloutEngine,
        RolloutScheduler,
        SampleFilter,
        SchedulerFactory,
        Trainer,
        TrainingBackend,
        WeightSyncTransport,
    )
    from rlhf.config.run import RunConfig
    from rlhf.host.options import OptionsRegister
    from rlhf.registry import Register
    from rlhf.steering import Steering


# ---------------------------------------------------------------- registration


@hookspec
def rlhf_register_advantage_estimators(register: Register[type[AdvantageEstimator]]) -> None:
    """Register advantage estimators, selected by ``--algo.advantage.estimator NAME``.

    When: at plugin load. Process: every process that loads plugins. How often: once per process.
    Shapes: none here; the estimator protocol (:class:`rlhf.components.AdvantageEstimator`)
    maps per-sequence rewards ``(num_prompts, n)`` and per-token tensors ``(B, T)``.
    """


@hookspec
def rlhf_register_policy_losses(register: Register[type[PolicyLoss]]) -> None:
    """Register policy losses, selected by ``--actor.policy_loss_type NAME``.

    When: at plugin load. Process: every process that loads plugins. How often: once per process.
    Shapes: none here; a loss maps per-token log-probs/advantages ``(B, T)`` to a per-token loss ``(B, T)``.
    """


@hookspec
def rlhf_register_kl_estimators(register: Register[type[KLEstimator]]) -> None:
    """Register KL estimators, selected by ``--algo.kl.estimator NAME`` (``k1``, ``k2``, ``k3`` come from rlhf-plugin-kl).

    When: at plugin load. Process: every process that loads plugins. How often: once per process.
    Shapes: none here; an estimator maps the per-token log-ratio log π − log π_ref ``(B, T)`` to a
    per-token KL estimate ``(B, T)`` (:class:`rlhf.components.KLEstimator`).
    """


@hookspec
def rlhf_register_sample_filters(register: Register[type[SampleFilter]]) -> None:
    """Register sample filters (e.g. DAPO dynamic filtering), enabled by their own flags.

    When: at plugin load. Process: every process that loads plugins. How often: once per process.
    Shapes: none here; a filter reads per-sequence scores grouped as ``(num_prompts, n)``.
    """


@hookspec
def rlhf_register_rollout_corrections(register: Register[type[RolloutCorrection]]) -> None:
    """Register train/rollout mismatch corrections (TIS, ICEPOP, sequence masks…); every one is built and the
    one its own flags switch on (``active``) applies.

    When: at plugin load. Process: every process that loads plugins. How often: once per process.
    Shapes: none here; a correction maps per-token log-probs ``(B, T)`` to a coefficient ``(B, T)``.
    """


@hookspec
def rlhf_register_trainers(register: Register[type[Trainer]]) -> None:
    """Register trainers, run by ``rlhf train NAME``.

    When: at plugin load. Process: the CLI / controller process (workers never run trainers).
    How often: once per process. Shapes: none.
    """


@hookspec
def rlhf_register_reward_functions(register: Register[RewardFunction]) -> None:
    """Register reward functions (rule rewards, remote rewards, reward-model adapters).

    When: at plugin load. Process: every process that loads plugins. How often: once per process.
    Shapes: none here; a reward function returns one scalar per sample, ``(B,)``.
    """


@hookspec
def rlhf_register_reward_shapers(register: Register[type[RewardShaper]]) -> None:
    """Register reward shaping rules (overlong penalty, stop-properly penalty, normalisation…).

    When: at plugin load. Process: every process that loads plugins. How often: once per process.
    Shapes: none here; a shaper maps per-sequence rewards ``(B,)`` to ``(B,)``.
    """


@hookspec
def rlhf_register_reward_managers(register: Register[type[RewardManager]]) -> None:
    """Register reward managers (how the run's reward sources make each sample's reward), selected by
    ``--reward.manager NAME``.

    When: at plugin load. Process: every process that loads plugins. How often: once per process.
    Shapes: none here; see :class:`rlhf.components.RewardManager`.
    """


@hookspec
def rlhf_register_agent_executors(register: Register[type[AgentExecutor]]) -> None:
    """Register agent executors (single-turn, multi-turn, OpenAI-server…).

    When: at plugin load. Process: every process that loads plugins. How often: once per process.
    Shapes: none; executors exchange token-id lists, never re-tokenised text.
    """


@hookspec
def rlhf_register_prompt_sources(register: Register[type[PromptSource]]) -> None:
    """Register prompt sources: rows made on demand (generated tasks, tasksets, curricula), picked with
    ``--data.prompt_source NAME`` instead of ``--data.prompt_dataset`` files.

    When: at plugin load. Process: every process that loads plugins. How often: once per process.
    Shapes: none; a source makes rows (dicts) in the controller, tokenized there as a file's rows are.
    """


@hookspec
def rlhf_register_model_loaders(register: Register[type[ModelLoader]]) -> None:
    """Register model loaders (plain HF, LoRA, quantised, custom architectures).

    When: at plugin load. Process: every process that loads plugins. How often: once per process.
    Shapes: none.
    """


@hookspec
def rlhf_register_processors(register: Register[type[Processor]]) -> None:
    """Register input processors (VLM image/video processors, custom tokenisation).

    When: at plugin load. Process: every process that loads plugins. How often: once per process.
    Shapes: none here; processors turn one dataset row into prompt token ids plus media.
    """


@hookspec
def rlhf_register_optimizers(register: Register[type[OptimizerFactory]]) -> None:
    """Register optimizers, selected by ``--actor.optim NAME`` / ``--critic.optim NAME``.

    When: at plugin load. Process: every process that loads plugins. How often: once per process.
    Shapes: none.
    """


@hookspec
def rlhf_register_schedulers(register: Register[type[SchedulerFactory]]) -> None:
    """Register learning-rate schedulers, selected by ``--actor.lr_scheduler NAME``.

    When: at plugin load. Process: every process that loads plugins. How often: once per process.
    Shapes: none.
    """


@hookspec
def rlhf_register_rollout_engines(register: Register[type[RolloutEngine]]) -> None:
    """Register rollout engines (vLLM, HF ``generate``…), selected by ``--rollout.engine NAME``.

    When: at plugin load. Process: every process that loads plugins. How often: once per process.
    Shapes: none here; see :class:`rlhf.components.RolloutEngine` for what an engine receives and returns.
    """


@hookspec
def rlhf_register_weight_sync_transports(register: Register[type[WeightSyncTransport]]) -> None:
    """Register weight-sync transports (object store, gloo/NCCL broadcast, CUDA IPC…), selected by
    ``--vllm.sync_backend NAME`` (``auto``: the most preferred one that can run for the config).

    When: at plugin load. Process: every process that loads plugins. How often: once per process.
    Shapes: none here; see :class:`rlhf.components.WeightSyncTransport`.
    """


@hookspec
def rlhf_register_training_backends(register: Register[type[TrainingBackend]]) -> None:
    """Register training backends (DeepSpeed ZeRO, torch FSDP2…), selected by ``--train.backend NAME``.

    When: at plugin load. Process: every process that loads plugins. How often: once per process.
    Shapes: none here; see :class:`rlhf.components.TrainingBackend` and :class:`rlhf.components.TrainedModel`.
    """


@hookspec
def rlhf_register_rollout_schedulers(register: Register[type[RolloutScheduler]]) -> None:
    """Register rollout schedulers (in turn, ahead of training…), selected by ``--train.rollout_scheduler NAME``.

    When: at plugin load. Process: every process that loads plugins. How often: once per process.
    Shapes: none here; see :class:`rlhf.components.RolloutScheduler`.
    """


@hookspec
def rlhf_register_presets(register: Register[dict[str, Any]]) -> None:
    """Register named recipes, selected by ``--algo.preset NAME``: a dict of dotted config keys to
    values (e.g. ``{"algo.advantage.estimator": "group_norm", "rollout.n_samples_per_prompt": 8}``).

    A preset sits between the defaults and the YAML file: ``--config`` and flags override it.
    When: at plugin load. Process: every process that loads plugins. How often: once per process.
    Shapes: none.
    """


@hookspec
def rlhf_register_commands(register: Register[type[Command]]) -> None:
    """Register top-level subcommands, run as ``rlhf NAME [args]`` (e.g. ``rlhf generate``).

    ``NAME`` may have several words, so plugins share a first word: ``register("serve tinker", …)`` adds
    ``rlhf serve tinker`` beside another plugin's ``serve reward``; the longest registered name the command
    line spells runs, and ``rlhf serve --help`` lists the targets (docs/plugins/command.md).

    A command class has a ``help`` string, a ``add_arguments(parser)`` classmethod filling an
    argparse parser, and ``run(host, args) -> int`` (the exit status).
    When: at plugin load. Process: the CLI process. How often: once per process.
    Shapes: none.
    """


@hookspec
def rlhf_register_options(register: OptionsRegister) -> None:
    """Declare this plugin's options: a pydantic model, read from ``--<namespace>.<field>``
    flags and the ``plugins: {<namespace>: …}`` block of a YAML config.

    Call ``register(Model)`` (namespace = the plugin's name) or ``register(Model, namespace="x")``.
    Two plugins claiming one namespace, or a namespace equal to a core config section,
    is a load-time error naming both.
    When: at plugin load. Process: every process that loads plugins. How often: once per process.
    Shapes: none.
    """


@hookspec
def rlhf_translate_argv(command: str, argv: list[str], known_flags: list[str], config_class: type | None) -> list[str] | None:
    """Rewrite a command line before it is parsed: e.g. another framework's flag spellings into today's
    (rlhf-plugin-openrlhf-compat translates OpenRLHF's), or a team's own shorthand flags.

    ``command`` is what follows ``rlhf`` (``train ppo``, ``generate``); ``argv`` the command line after it;
    ``known_flags`` every flag that command takes (a translation must land on them); ``config_class``
    the trainer's config class (None for a plugin command). Return the new argv, or None to leave it.
    Implementations run one after another, each on the previous one's result (in pluggy's call order).
    Raise :class:`rlhf.errors.ConfigError` for a flag that cannot be translated: its message is the one
    ``rlhf: error:`` line the user sees. Log, do not print, what was rewritten.
    When: before a trainer's or plugin command's flags are parsed. Process: the CLI process (and
    whichever process calls :func:`rlhf.launch.trainer_run`). How often: once per command line parsed.
    Shapes: none.
    """


# ------------------------------------------------------------------- lifecycle


@hookspec
def rlhf_worker_init(role: str, rank: int, config: RunConfig) -> None:
    """A Ray worker finished loading plugins and is about to build its model.

    ``role`` is one of ``actor``, ``critic``, ``ref``, ``reward``, ``rollout``; ``rank`` is
    the worker's rank inside its group; ``config`` is the validated run config.
    When: worker start-up. Process: the worker itself. How often: once per worker.
    Shapes: none.
    Raising stops the run with one ``rlhf: error:`` line naming the plugin and this hook.
    """


@hookspec
def rlhf_train_start(config: RunConfig, run_dir: Path) -> None:
    """A training run is about to take its first step (after resume, if any).

    When: start of ``rlhf train``. Process: the controller. How often: once per run.
    Shapes: none.
    Raising stops the run with one ``rlhf: error:`` line naming the plugin and this hook.
    """


@hookspec
def rlhf_step_end(step: int, metrics: dict[str, float]) -> None:
    """One training step finished; ``metrics`` holds plain floats (reward, KL, timings…).

    When: after the optimizer step and weight sync of each global step.
    Process: the controller. How often: once per global step.
    Shapes: scalars only; no tensors cross this hook.
    Raising stops the run with one ``rlhf: error:`` line naming the plugin and this hook.
    """


@hookspec
def rlhf_rollout_samples(step: int, kind: str, samples: list[dict[str, Any]]) -> None:
    """A step's samples, for observers that show or keep what the model generated (the sample table of
    rlhf-plugin-rollouts, TensorBoard text and wandb Tables of rlhf-plugin-trackers).

    ``kind`` is ``train`` (the rollout batch the step trained on) or ``eval`` (the step's evaluation);
    ``samples`` holds one plain record per sample, the columns of :data:`rlhf.records.rollouts.COLUMNS`
    (prompt, response, reward and each ``reward/<term>``, advantage, log-probs, finish reason, length…) plus
    the ``extra/…`` columns reward functions and agent executors added; an eval record has no advantage,
    return or trainer log-probs. Read them; do not modify them (``--rollout.dump_dir`` writes the same).
    ``--logger.samples N`` says how many a step shows (:func:`rlhf.records.rollouts.shown_samples` picks them).
    When: after each global step of an RL run, before ``rlhf_steer`` (``train``), and after each evaluation
    (``eval``). Process: the controller. How often: once per global step, once more per evaluation.
    Shapes: lists of floats and ints, no tensors.
    Raising stops the run with one ``rlhf: error:`` line naming the plugin and this hook.
    """


@hookspec
def rlhf_steer(step: int, metrics: dict[str, float], steering: Steering) -> None:
    """Steer the run between steps: read this step's ``metrics`` and ask, through ``steering``
    (:class:`rlhf.steering.Steering`, one handle per plugin), to stop, checkpoint, evaluate, change
    the prompt datasets' sampling weights or set a coefficient (``kl``, ``entropy``, ``lr_scale``).

    The controller applies the requests after every plugin returned, logs each (console and
    ``steer/…`` keys of this step's ``metrics.jsonl`` record) and keeps the state they set in
    the checkpoint. ``metrics`` is the step's record so far (read it; do not modify it).
    When: after each global step (and its evaluation, if due), before it is logged and checkpointed.
    Process: the controller. How often: once per global step.
    Shapes: scalars only; no tensors cross this hook.
    Raising stops the run with one ``rlhf: error:`` line naming the plugin and this hook.
    """


@hookspec
def rlhf_train_end(config: RunConfig, run_dir: Path, status: str) -> None:
    """A training run ended; ``status`` is ``completed``, ``stopped`` (a plugin's ``rlhf_steer`` asked),
    ``preempted`` (a preemption signal: the checkpoint of the last step was written, docs/preemption.md),
    ``interrupted`` or ``failed``.

    When: end of ``rlhf train``, also on failure. Process: the controller. How often: once per run.
    Shapes: none.
    Raising stops the run with one ``rlhf: error:`` line naming the plugin and this hook.
    """


@hookspec
def rlhf_checkpoint_save(step: int, checkpoint_dir: Path, state: dict[str, Any]) -> None:
    """A checkpoint is being written; plugins may add JSON-serialisable entries to ``state``
    (stored under their plugin name) and extra files inside ``checkpoint_dir``.

    The directory is a staging dir renamed into place only after every hook returned,
    so a crash never leaves a half-written checkpoint.
    When: every ``--ckpt.save_steps`` steps and at the end. Process: the controller.
    How often: once per checkpoint. Shapes: none.
    Raising stops the run with one ``rlhf: error:`` line naming the plugin and this hook.
    """


@hookspec
def rlhf_checkpoint_load(step: int, checkpoint_dir: Path, state: dict[str, Any]) -> None:
    """A run resumes from ``checkpoint_dir``; ``state`` is what ``rlhf_checkpoint_save`` stored.

    When: at start-up with ``--ckpt.load_enable`` and a checkpoint present.
    Process: the controller. How often: once per resumed run. Shapes: none.
    Raising stops the run with one ``rlhf: error:`` line naming the plugin and this hook.
    """
