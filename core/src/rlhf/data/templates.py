"""Turning a dataset value into the model's text: the chat template or ``--data.input_template``.

Shared by the RL prompt loader and the supervised trainers so a prompt is rendered the
same way when a model is trained by SFT/DPO and when it is later sampled by RL.
"""

from __future__ import annotations

from typing import Any


def as_messages(value: Any, role: str = "user") -> list[dict[str, Any]]:
    """A string becomes one message of ``role``; a list of messages is kept as is."""
    return [{"role": role, "content": value}] if isinstance(value, str) else list(value)


def format_prompt(value: Any, data_cfg: Any, tokenizer: Any) -> tuple[str, list[int]]:
    """The prompt text and its token ids (with the tokenizer's special tokens, as the model saw them)."""
    if data_cfg.apply_chat_template:
        text = tokenizer.apply_chat_template(as_messages(value), tokenize=False, add_generation_prompt=True)
        return text, tokenizer(text, add_special_tokens=False)["input_ids"]
    text = data_cfg.input_template.format(value) if data_cfg.input_template else str(value)
    return text, tokenizer(text)["input_ids"]
