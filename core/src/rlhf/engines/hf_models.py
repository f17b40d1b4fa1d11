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


def load_causal_lm(path: str, dtype: Any, attn: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation=attn_implementation(attn))


def load_value_model(path: str, dtype: Any, attn: str, head: str = "score") -> Any:
    """A sequence-regression model whose ``head`` maps every hidden state to one value.

    A causal-LM checkpoint (e.g. the actor used as critic) gets a freshly initialised head.
    """
    from transformers import AutoModelForSequenceClassification

    model = AutoModelForSequenceClassification.from_pretrained(
        path, num_labels=1, dtype=dtype, attn_implementation=attn_implementation(attn)
    )
    if not hasattr(model, head):
        raise ValueError(f"model at {path} has no value head named {head!r} (--ds.value_head_prefix)")
    return model


def token_values(model: Any, input_ids: Any, attention_mask: Any, head: str = "score") -> Any:
    """Per-position values ``(B, L)`` from a value model: its head applied to every hidden state."""
    backbone = getattr(model, model.base_model_prefix)
    hidden = backbone(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    return getattr(model, head)(hidden).squeeze(-1).float()
