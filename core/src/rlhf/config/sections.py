"""Config sections every trainer shares: the optimizer (``--adam.*``, ``--muon.*``), the model and
parallelism options (``--ds.*``, with ``--ds.lora.*``) and logging (``--logger.*``).

``rlhf train ppo`` (:mod:`rlhf.config.ppo`) and the supervised trainers (``rlhf_supervised.config``)
build their config trees from them, so a flag means the same in every command.
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from pydantic import Field, field_validator

from rlhf.config.base import Section, flag, plugin_flag

__all__ = ["AdamSection", "ChatTemplateFields", "DeepSpeedSection", "LoggerSection", "LoraSection", "MuonSection", "PreemptionFields", "WandbSection"]


def _default_run_name() -> str:
    return "ppo_" + time.strftime("%m%dT%H:%M")


class AdamSection(Section):
    lr: float = flag(1e-6, "Adam learning rate")
    betas: list[float] = flag([0.9, 0.95], "Adam betas", nargs=2)
    eps: float = flag(1e-8, "Adam epsilon")
    weight_decay: float = flag(0.0, "Adam weight decay")


class PreemptionFields(Section):
    """The ``--ckpt.*`` fields of a preemption warning (rlhf.records.preemption, docs/preemption.md); a trainer's
    checkpoint section subclasses it and calls ``rlhf.records.preemption.step_done`` after each step."""

    preemption_signals: str = flag("SIGTERM,SIGUSR1", "Signals that mean: finish the step in flight, write a "
                                   "checkpoint, exit with status 75 (comma-separated names; SLURM's --signal sends USR1)")
    preemption_budget: float = flag(120.0, "Seconds a preemption signal leaves to finish the step and write its "
                                    "checkpoint; past them the run stops without it")


class ChatTemplateFields(Section):
    """``--data.chat_template_kwargs``: variables the chat template reads beside the messages, for every render of a
    run's data (prompts, responses, environment turns); a trainer's data section subclasses it."""

    chat_template_kwargs: dict[str, Any] | None = flag(
        None, "Variables for the chat template, as a JSON object: '{\"enable_thinking\": false}' switches Qwen3's "
              "thinking off, '{\"reasoning_effort\": \"low\"}' sets gpt-oss's effort")

    @field_validator("chat_template_kwargs", mode="before")
    @classmethod
    def _json_object(cls, value: Any) -> Any:
        """A flag's text is JSON; YAML gives the mapping itself."""
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise ValueError(f"not JSON ({exc.msg} at column {exc.colno}); give an object such as "
                                 "'{\"enable_thinking\": false}'") from None
        if value is not None and not isinstance(value, dict):
            raise ValueError(f"must be a JSON object of template variables, not {type(value).__name__}")
        return value


class MuonSection(Section):
    lr: float = flag(0.02, "LR of the Muon 2-D weight group")
    momentum: float = flag(0.95, "Muon momentum")
    ns_steps: int = flag(5, "Newton-Schulz steps")
    nesterov: bool = flag(True, "Nesterov momentum for Muon", switch=True, negate="no_nesterov")


class WandbSection(Section):
    key: str | None = plugin_flag("trackers", None, "wandb API key")
    org: str | None = flag(None, "wandb organisation")
    group: str | None = flag(None, "wandb group")
    project: str = flag("openrlhf_train_ppo", "wandb project")
    run_name: str = flag(None, "wandb run name (default ppo_<MMDDTHH:MM>)", default_factory=_default_run_name)


class LoggerSection(Section):
    logging_steps: int = flag(1, "Log every N steps")
    wandb: WandbSection = Field(default_factory=WandbSection)
    tensorboard_dir: str | None = plugin_flag("trackers", None, "TensorBoard logging path")
    samples: int = flag(0, "Samples shown per logged step: a table on the console, text in TensorBoard, a wandb Table")
    samples_steps: int = flag(0, "Show --logger.samples every N steps (0: every --logger.logging_steps)")


class LoraSection(Section):
    rank: int = flag(0, "LoRA rank (0 disables LoRA)")
    alpha: int = flag(16, "LoRA alpha")
    target_modules: str | list[str] = flag("all-linear", "LoRA target modules", nargs="*")
    dropout: float = flag(0.0, "LoRA dropout")


class DeepSpeedSection(Section):
    use_universal_ckpt: bool = flag(False, "Use DeepSpeed universal checkpoints", switch=True)
    zero_stage: int = flag(2, "DeepSpeed ZeRO stage")
    deepcompile: bool = flag(False, "DeepSpeed deepcompile", switch=True)
    param_dtype: Literal["bf16", "fp16", "fp32"] = flag("bf16", "Model data type (fp32 allowed on CPU)")
    zpg: int = flag(1, "ZeRO++ max partition size")
    adam_offload: bool = flag(False, "Offload Adam optimizer states to CPU", switch=True)
    attn_implementation: str = flag("flash_attention_2", "Attention implementation (eager, sdpa, flash_attention_2…)")
    experts_implementation: Literal["eager", "batched_mm", "grouped_mm", "deepgemm"] | None = flag(
        None, "MoE expert computation strategy"
    )
    use_liger_kernel: bool = plugin_flag("liger", False, "Enable Liger kernels (GPU only)", switch=True)
    grad_accum_dtype: str | None = flag(None, "Adam grad accumulation data type")
    overlap_comm: bool = flag(False, "Overlap communication", switch=True)
    enable_sleep: bool = flag(False, "DeepSpeed sleep mode with --train.colocate_all", switch=True)
    tensor_parallel_size: int = flag(1, "DeepSpeed tensor parallel size")
    packing_samples: bool = flag(False, "Pack samples without padding", switch=True)
    load_in_4bit: bool = flag(False, "Load the model in 4 bit", switch=True)
    lora: LoraSection = Field(default_factory=LoraSection)
    ring_attn_size: int = plugin_flag("ring-attn", 1, "Ring attention group size")
    ring_attn_head_stride: int = plugin_flag("ring-attn", 1, "Heads per ring-attention step (a divisor of the head count)")
    value_head_prefix: str = flag("score", "Name of the value head of reward/critic models")

