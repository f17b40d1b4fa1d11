"""LoRA / QLoRA through peft, for every trained model (supervised trainers and RL actors).

``--ds.lora.rank R`` (> 0) wraps the loaded model in a peft LoRA model: only the
adapters (and, for reward models, the value head) train, checkpoints and final saves
hold the adapter only, and ``rlhf lora merge`` (rlhf-plugin-lora-merge) folds an adapter into its base model.
``--ds.load_in_4bit`` (QLoRA) loads the frozen base in 4-bit NF4 with bitsandbytes,
which needs a CUDA GPU.
"""

from __future__ import annotations

from typing import Any

from rlhf.config.checks import check_4bit

#: The plugin API (docs/plugin-api.md); the module's other names may change in any release.
__all__ = ["apply_lora", "quantization_kwargs"]


def lora_enabled(ds: Any) -> bool:
    return ds.lora.rank > 0


def quantization_kwargs(ds: Any) -> dict[str, Any]:
    """``from_pretrained`` arguments of ``--ds.load_in_4bit`` (a ``BitsAndBytesConfig``); empty without it."""
    if not ds.load_in_4bit:
        return {}
    check_4bit(ds)
    import torch
    from transformers import BitsAndBytesConfig

    return {"quantization_config": BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                                      bnb_4bit_use_double_quant=True,
                                                      bnb_4bit_compute_dtype=torch.bfloat16)}


def apply_lora(model: Any, ds: Any, *, value_head: str | None = None, gradient_checkpointing: bool = False) -> Any:
    """Wrap ``model`` in peft LoRA adapters per ``--ds.lora.*``; returns the model unchanged when rank is 0.

    ``value_head``: a reward/critic head trained in full next to the adapters (saved with them).
    """
    if not lora_enabled(ds):
        return model
    from peft import LoraConfig, TaskType, get_peft_model, prepare_model_for_kbit_training

    if ds.load_in_4bit:
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=gradient_checkpointing)
    elif gradient_checkpointing:
        model.enable_input_require_grads()  # checkpointed blocks need an input that requires grad
    targets = ds.lora.target_modules
    if isinstance(targets, list) and len(targets) == 1:
        targets = targets[0]
    config = LoraConfig(
        r=ds.lora.rank,
        lora_alpha=ds.lora.alpha,
        lora_dropout=ds.lora.dropout,
        target_modules=targets,
        task_type=TaskType.SEQ_CLS if value_head else TaskType.CAUSAL_LM,
        modules_to_save=[value_head] if value_head else None,
        bias="none",
    )
    return get_peft_model(model, config)


def is_peft(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "merge_adapter")


def merged_state_dict(model: Any) -> dict[str, Any]:
    """The base model's state dict with the adapters folded in, under the base model's own names.

    Used for RL weight sync to the rollout engines. ZeRO-3 callers gather first.
    """
    model.merge_adapter()
    try:
        out: dict[str, Any] = {}
        for name, tensor in model.state_dict().items():
            if "lora_" in name or ".original_module." in name:
                continue
            name = name.removeprefix("base_model.model.").replace(".base_layer.", ".")
            name = name.replace(".modules_to_save.default.", ".")
            out[name] = tensor.detach().to("cpu", copy=True)
        return out
    finally:
        model.unmerge_adapter()
