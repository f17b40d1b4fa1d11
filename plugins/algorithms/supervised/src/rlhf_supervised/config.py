"""The configuration tree shared by the supervised trainers (``rlhf train sft|rm|dpo|kto|prm|kd``).

Section and flag names follow OpenRLHF's supervised CLIs (``train_sft``, ``train_rm``,
``train_dpo``): ``--model.*`` for the trained model and its loss, ``--train.*`` for the
schedule, ``--adam.*`` for the optimizer, ``--ds.*``, ``--data.*``, ``--eval.*``,
``--ckpt.*``, ``--logger.*``. Each trainer plugin subclasses :class:`SupervisedConfig`
and its ``model`` section to add its own loss flags.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

from pydantic import Field

from rlhf.config.base import Section, flag, plugin_options_field, plugin_set_field
from rlhf.config.sections import (
    AdamSection,
    ChatTemplateFields,
    DeepSpeedSection,
    LoggerSection,
    MuonSection,
    PreemptionFields,
)
from rlhf.registry import ComponentKind as K


class SupervisedModelSection(Section):
    model_name_or_path: str | None = flag(None, "HF model name or path of the trained model")
    aux_loss_coef: float = flag(0.0, "MoE balancing loss coefficient")


class FrozenModelSection(Section):
    """A model that is only evaluated: the DPO/KTO reference or the distillation teacher."""

    model_name_or_path: str | None = flag(None, "HF model name or path (default: the trained model's)")
    offload: bool = flag(False, "Offload its weights to CPU (ZeRO-3 parameter offload)", switch=True)


class SupervisedTrainSection(Section):
    micro_batch_size: int = flag(8, "Batch size per device per forward")
    batch_size: int = flag(128, "Global batch size per optimizer step")
    max_epochs: int = flag(2, "Passes over the training data")
    seed: int = flag(42, "Random seed (data order, initialisation of new heads)")
    full_determinism_enable: bool = flag(False, "Reproducible behaviour: deterministic torch algorithms (slower on GPU)",
                                         switch=True)
    optim: str = flag("adam", "Optimizer (a registered optimizer name)", component=K.OPTIMIZER)
    lr_scheduler: str = flag("cosine_with_min_lr", "LR scheduler (a registered scheduler name)", component=K.SCHEDULER)
    lr_warmup_ratio: float = flag(0.03, "Warmup steps as a fraction of training steps")
    min_lr_ratio: float = flag(0.1, "Minimum LR as a fraction of the peak LR")
    max_norm: float = flag(1.0, "Gradient clipping norm")
    gradient_checkpointing_enable: bool = flag(False, "Gradient checkpointing", switch=True)
    gradient_checkpointing_reentrant: bool = flag(False, "Reentrant gradient checkpointing", switch=True)
    backend: str = flag("deepspeed", "Training backend by name (rlhf plugins lists them): deepspeed (ZeRO, the --ds.* "
                        "flags) or another installed one", component=K.TRAINING_BACKEND)
    model_loaders: list[str] = flag([], "Registered model loaders to apply to every model, in order (besides those whose "
                                    "flags are set)", nargs="+", component=K.MODEL_LOADER)


class SupervisedDataSection(ChatTemplateFields):
    dataset: str | None = flag(None, "Training dataset path(s) or name(s), comma-separated")
    dataset_probs: str | None = flag(None, "Sampling probabilities of the datasets, comma-separated")
    dataset_split: str = flag("train", "Split of the training datasets")
    max_len: int = flag(2048, "Max tokens per sample; longer samples are dropped (and counted)")
    max_samples: int = flag(100000000, "Max number of training samples")
    input_key: str = flag("input", "Dataset key of the prompt")
    input_template: str | None = flag("User: {}\nAssistant: ", "Prompt template with one {} (unused with a chat template)")
    apply_chat_template: bool = flag(False, "Use the tokenizer's chat template", switch=True)
    tokenizer_chat_template: str | None = flag(None, "A Jinja chat template replacing the tokenizer's")
    disable_fast_tokenizer: bool = flag(False, "Use the slow tokenizer", switch=True)
    dataloader_num_workers: int = flag(0, "Worker processes that collate the next steps' micro-batches (0: in the trainer)")


class SupervisedEvalSection(Section):
    steps: int = flag(-1, "Evaluate every N optimizer steps (-1: only at the end)")
    dataset: str | None = flag(None, "Evaluation dataset path(s) (default: none)")
    split: str = flag("train", "Split of the evaluation dataset")
    holdout: float = flag(0.0, "Hold out this fraction of the training data for evaluation when no --eval.dataset")


class SupervisedCkptSection(PreemptionFields):
    save_steps: int = flag(-1, "Save a checkpoint every N optimizer steps (-1: never)")
    path: str = flag("./ckpt/checkpoints", "Checkpoint directory")
    max_num: int = flag(3, "Checkpoints to keep")
    max_mem: float = flag(math.inf, "Maximum checkpoint disk use (GB)")
    load_enable: bool = flag(False, "Resume from the latest checkpoint", switch=True)
    output_dir: str = flag("./ckpt", "Output directory of the final model (or LoRA adapter)")


class SupervisedConfig(Section):
    """Fields every supervised trainer has; plugins subclass it (and ``model``) for their loss flags."""

    trainer_family: ClassVar[str] = "supervised"  # which lines of rlhf.config.refused.REFUSED apply; the OpenRLHF-compat plugin's table

    model: SupervisedModelSection = Field(default_factory=SupervisedModelSection)
    train: SupervisedTrainSection = Field(default_factory=SupervisedTrainSection)
    adam: AdamSection = Field(default_factory=lambda: AdamSection(lr=5e-6))
    muon: MuonSection = Field(default_factory=MuonSection)
    ds: DeepSpeedSection = Field(default_factory=DeepSpeedSection)
    data: SupervisedDataSection = Field(default_factory=SupervisedDataSection)
    eval: SupervisedEvalSection = Field(default_factory=SupervisedEvalSection)
    ckpt: SupervisedCkptSection = Field(default_factory=SupervisedCkptSection)
    logger: LoggerSection = Field(default_factory=LoggerSection)
    local_rank: int = flag(-1, "local_rank for deepspeed")
    use_ms: bool = flag(False, "Fetch models from ModelScope (refused: pass a local directory)", switch=True)
    plugins: dict[str, dict[str, Any]] = plugin_options_field()
    plugin_set: list[dict[str, Any]] = plugin_set_field()


class PromptResponseDataSection(SupervisedDataSection):
    """Rows of a prompt (``--data.input_key``) and a response (``--data.output_key``): sft, kd, kto."""

    output_key: str = flag("output", "Dataset key of the response")


class PreferenceDataSection(SupervisedDataSection):
    """Pairwise preference data (reward models, DPO): a prompt and a chosen/rejected response."""

    prompt_key: str | None = flag(None, "Dataset key of the prompt (none: chosen/rejected are complete texts)")
    chosen_key: str = flag("chosen", "Dataset key of the preferred response")
    rejected_key: str = flag("rejected", "Dataset key of the dispreferred response")
    margin_key: str | None = flag(None, "Dataset key of a per-pair margin (reward models with --model.margin_loss_enable)")
