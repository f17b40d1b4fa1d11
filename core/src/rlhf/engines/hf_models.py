"""Loading HF models for the actor/reference (causal LM) and critic/reward (value head) roles."""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

log = logging.getLogger("rlhf.models")


def attn_implementation(requested: str) -> str:
    """flash-attn is GPU-only; fall back to sdpa (same numbers, slower) when it cannot run here."""
    import torch

    if requested.startswith("flash_attention") and (not torch.cuda.is_available() or importlib.util.find_spec("flash_attn") is None):
        log.info("attention %s is unavailable on this machine; using sdpa", requested)
        return "sdpa"
    return requested


def load_causal_lm(path: str, dtype: Any, attn: str, **kwargs: Any) -> Any:
    """``kwargs``: more ``from_pretrained`` arguments (a 4-bit quantization config)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn_implementation(attn), **kwargs)


def load_value_model(path: str, dtype: Any, attn: str, head: str = "score", *, require_head: bool = False,
                     **kwargs: Any) -> Any:
    """A sequence-regression model whose ``head`` maps every hidden state to one value.

    A causal-LM checkpoint (e.g. the actor used as critic, or an SFT model becoming a
    reward model) gets a fresh bias-free head drawn from N(0, 1/(d+1)), as OpenRLHF's.
    ``require_head``: a checkpoint without a trained head is an error (reward models must have one).
    ``kwargs``: more ``from_pretrained`` arguments (a 4-bit quantization config).
    """
    from transformers import AutoModelForSequenceClassification

    model, info = AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=1, dtype=dtype, attn_implementation=attn_implementation(attn), output_loading_info=True, **kwargs
    )
    if not hasattr(model, head):
        raise ValueError(f"model at {path} has no value head named {head!r} (--ds.value_head_prefix); "
                         f"{type(model).__name__} names its head 'score'")
    if any(key.startswith(f"{head}.") for key in info.get("missing_keys", ())):
        if require_head:
            raise ValueError(f"{path} has no trained value head {head!r}, so its rewards would be random; "
                             "pass a reward model trained with `rlhf train rm` (or set --ds.value_head_prefix)")
        _init_value_head(getattr(model, head), model.config.hidden_size)
    return model


def _init_value_head(head: Any, hidden_size: int) -> None:
    import torch

    from rlhf.engines.deepspeed_strategy import gathered

    with gathered(head), torch.no_grad():  # under ZeRO-3 the head is partitioned at load
        head.weight.normal_(mean=0.0, std=1.0 / (hidden_size + 1) ** 0.5)


def token_values(model: Any, input_ids: Any, attention_mask: Any = None, head: str = "score", **inputs: Any) -> Any:
    """Per-position values ``(B, L)`` from a value model: its head applied to every hidden state.

    ``inputs``: more forward arguments (``position_ids`` of a packed batch). A peft-wrapped
    model is read through its base model; the LoRA layers sit inside it.
    """
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    backbone = getattr(model, model.base_model_prefix)
    inputs["use_cache"] = False  # a cache would also switch off packed-sequence masking
    hidden = backbone(input_ids=input_ids, attention_mask=attention_mask, **inputs).last_hidden_state
    return getattr(model, head)(hidden).squeeze(-1).float()
