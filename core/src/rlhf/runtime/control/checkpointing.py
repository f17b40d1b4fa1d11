"""What a checkpoint of ``rlhf train ppo`` holds (the trained groups' states, the step, the data position, the KL
coefficient, steering, the plugins' and the rollout scheduler's states) and how a run resumes from one."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rlhf.components.rollout import RolloutLoop
from rlhf.config.training_backend import converts_from, model_record
from rlhf.records import checkpoints as checkpoint
from rlhf.runtime.cluster.placement import ranks_of

if TYPE_CHECKING:
    from rlhf.config.ppo import PPOConfig
    from rlhf.host.plugin_host import PluginHost
    from rlhf.registry import ComponentRegistry
    from rlhf.runtime.control.kl_control import KLController
    from rlhf.runtime.workers.group import WorkerGroup

log = logging.getLogger("rlhf.runtime")

#: What a PPO checkpoint's state.json must hold besides the step.
RESUMED_KEYS = ("data", "kl_coef")


def trained_models(config: PPOConfig, registry: ComponentRegistry, *, critic: bool) -> dict[str, dict[str, Any]]:
    """What a checkpoint of this run records of its trained groups (rlhf.records.checkpoint_fit): the actor's, and
    the critic's when the estimator trains one."""
    models = {"actor": model_record(config, registry, ranks_of(config.actor), config.actor.model_name_or_path,
                                    ema=config.train.enable_ema)}
    if critic:
        models["critic"] = model_record(config, registry, ranks_of(config.critic), config.critic.model_name_or_path)
    return models


class CheckpointedRun(RolloutLoop, Protocol):
    """The controller as a checkpoint sees it: the rollout loop's position (its step, prompt schedule, weight syncs
    and ``trained_data``), which a checkpoint records and a resume restores, with the KL coefficient and the
    steering plugins' coefficients; a resume then syncs the restored weights into the engines. A rollout scheduler's
    ``load_state`` is handed the same object, as the loop it schedules."""

    kl: KLController
    steered: dict[str, float]

    def sync_weights(self) -> None: ...


class PPOCheckpoints:
    """The checkpoints of one PPO run, in the CLI process: the trained groups (``actor``, ``critic``) write and load
    their own states; this writes the run's ``state.json`` beside them (with the plugins' and the rollout
    scheduler's states) and restores the run's position from the newest one under ``--ckpt.path``."""

    def __init__(self, config: PPOConfig, plugins: PluginHost, models: dict[str, dict[str, Any]], actor: WorkerGroup,
                 critic: WorkerGroup | None, scheduler: Any) -> None:
        self.config, self.plugins, self.models = config, plugins, models
        self.actor, self.critic, self.scheduler = actor, critic, scheduler

    def resume(self, run: CheckpointedRun) -> None:
        """``--ckpt.load_enable``: the newest checkpoint's states into the groups, and its position into ``run``."""
        if not self.config.ckpt.load_enable:
            return

        def load(directory: Path, state: dict[str, Any]) -> None:
            saved = {p["name"]: p.get("version") for p in state.get("plugin_set", [])}
            current = {p["name"]: p.get("version") for p in self.config.plugin_set}
            if saved != current:
                log.warning("resuming with plugins %s; the checkpoint was written with %s", current, saved)
            writers = {role: model.get("backend") for role, model in state.get("models", {}).items()}
            self.actor.call("load_checkpoint", str(directory), writers.get("actor"))
            if self.critic is not None:
                self.critic.call("load_checkpoint", str(directory), writers.get("critic"))
            run.step = state["step"]
            run.schedule.restore(state["data"])
            run.kl.value = state["kl_coef"]
            run.steered = state.get("steering", {})
            self.plugins.checkpoint_load(run.step, directory, state.get("plugins", {}))
            run.sync_weights()
            run.policy_version = state.get("policy_version", run.policy_version)  # as the uninterrupted run counts
            if (load_state := getattr(self.scheduler, "load_state", None)) is not None:
                load_state(directory, run)

        checkpoint.resume(Path(self.config.ckpt.path), load, keys=RESUMED_KEYS, models=self.models,
                          converts=converts_from(self.config, self.plugins.registry))

    def save(self, run: CheckpointedRun, root: Path | None = None, keep: int | None = None) -> Path:
        """A checkpoint of ``run``'s step under ``root`` (``--ckpt.path``), keeping the newest ``keep``
        (``--ckpt.max_num``)."""
        cfg = self.config
        plugin_state: dict[str, Any] = {}
        data = dict(run.trained_data or run.schedule.state())
        if run.schedule.weights is not None:  # the newest (async mode trained a batch drawn before the last change)
            data["weights"] = list(run.schedule.weights)
        state = {"step": run.step, "data": data, "kl_coef": run.kl.value,
                 "steering": run.steered, "policy_version": run.policy_version,
                 "plugin_set": cfg.plugin_set, "plugins": plugin_state, "models": self.models,
                 "config": cfg.model_dump(mode="json")}

        def write(staging: Path) -> None:
            if not cfg.ckpt.disable_ds:
                self.actor.call("save_checkpoint", str(staging))
                if self.critic is not None:
                    self.critic.call("save_checkpoint", str(staging))
            if cfg.ckpt.save_hf:
                self.actor.call("save_hf", str(staging / "hf"))
            if (save_state := getattr(self.scheduler, "save_state", None)) is not None:  # e.g. batches generated ahead
                save_state(staging)
            self.plugins.checkpoint_save(run.step, staging, plugin_state)

        return checkpoint.save(root or Path(cfg.ckpt.path), run.step, state, write, keep or cfg.ckpt.max_num,
                               max_gb=cfg.ckpt.max_mem)
