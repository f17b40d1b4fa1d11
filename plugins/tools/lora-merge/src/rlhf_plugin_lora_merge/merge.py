"""Fold a LoRA adapter into its base model and save a plain HF model (OpenRLHF's ``lora_combiner``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlhf.errors import ConfigError
from rlhf.models.loading import torch_dtype


def merge_adapter(base_path: str, adapter_path: str, output_path: str, *, is_rm: bool = False,
                  dtype: str = "bf16") -> Path:
    """Load the base, apply the adapter, fold it in, save a plain HF model."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    if not (Path(adapter_path) / "adapter_config.json").exists():
        raise ConfigError(f"--lora_path {adapter_path}: no adapter_config.json there (is it a LoRA adapter dir?)")
    auto = AutoModelForSequenceClassification if is_rm else AutoModelForCausalLM
    kwargs: dict[str, Any] = {"num_labels": 1} if is_rm else {}
    base = auto.from_pretrained(base_path, dtype=torch_dtype(dtype) if dtype else torch.float32, **kwargs)
    merged = PeftModel.from_pretrained(base, adapter_path).merge_and_unload()
    source_config = Path(adapter_path) / "config.json"
    if is_rm and source_config.exists():  # the RM's normalisation statistics travel with the adapter
        import json

        stats = json.loads(source_config.read_text())
        for key in ("mean", "std"):
            if key in stats:
                setattr(merged.config, key, stats[key])
    out = Path(output_path)
    merged.save_pretrained(out)
    tokenizer_source = adapter_path if (Path(adapter_path) / "tokenizer_config.json").exists() else base_path
    AutoTokenizer.from_pretrained(tokenizer_source).save_pretrained(out)
    return out
