"""What a checkpoint of ``rlhf train ppo`` holds (the trained groups' states, the step, the data position, the KL
coefficient, steering, the plugins' and the rollout scheduler's states) and how a run resumes from one."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rlhf.config.training_backend import converts_from, model_record
from rlhf.records import checkpoints as checkpoint
from rlhf.runtime.cluster.placement import ranks_of

log = logging.getLogger("rlhf.runtime")

#: What a PPO checkpoint's state.json must hold besides the step.
RESUMED_KEYS = ("data", "kl_coef")


class PPOCheckpoints:
    """The checkpoints of :class:`rlhf.runtime.control.controller.PPOController` (its base), in the CLI process: the
    controller's worker groups (``actor``, ``critic``) write and load their own states; this writes the run's
    ``state.json`` beside them and restores the controller's step, schedule, KL coefficient and steering."""

    def _resume(self) -> None:
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
            self.step = state["step"]
            self.schedule.restore(state["data"])
            self.kl.value = state["kl_coef"]
            self.steered = state.get("steering", {})
            self.plugins.checkpoint_load(self.step, directory, state.get("plugins", {}))
            self.sync_weights()
            self.policy_version = state.get("policy_version", self.policy_version)  # as the uninterrupted run counts
            if (load_state := getattr(self.scheduler, "load_state", None)) is not None:
                load_state(directory, self)

        checkpoint.resume(Path(self.config.ckpt.path), load, keys=RESUMED_KEYS, models=self.trained_models(),
                          converts=converts_from(self.config, self.plugins.registry))

    def trained_models(self) -> dict[str, dict[str, Any]]:
        """What a checkpoint of this run records of its trained groups (rlhf.records.checkpoint_fit)."""
        cfg, registry = self.config, self.plugins.registry
        models = {"actor": model_record(cfg, registry, ranks_of(cfg.actor), cfg.actor.model_name_or_path,
                                        ema=cfg.train.enable_ema)}
        if self.estimator.needs_critic:
            models["critic"] = model_record(cfg, registry, ranks_of(cfg.critic), cfg.critic.model_name_or_path)
        return models

    def save_checkpoint(self, root: Path | None = None, keep: int | None = None) -> Path:
        """A checkpoint of this step under ``root`` (``--ckpt.path``), keeping the newest ``keep`` (``--ckpt.max_num``)."""
        cfg = self.config
        plugin_state: dict[str, Any] = {}
        data = dict(self.trained_data or self.schedule.state())
        if self.schedule.weights is not None:  # the newest (async mode trained a batch drawn before the last change)
            data["weights"] = list(self.schedule.weights)
        state = {"step": self.step, "data": data, "kl_coef": self.kl.value,
                 "steering": self.steered, "policy_version": self.policy_version,
                 "plugin_set": cfg.plugin_set, "plugins": plugin_state, "models": self.trained_models(),
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
            self.plugins.checkpoint_save(self.step, staging, plugin_state)

        return checkpoint.save(root or Path(cfg.ckpt.path), self.step, state, write, keep or cfg.ckpt.max_num,
                               max_gb=cfg.ckpt.max_mem)
