"""Turning a dataset value into the model's text: the chat template or ``--data.input_template``.

Shared by the RL prompt loader and the supervised trainers so a prompt is rendered the
same way when a model is trained by SFT/DPO and when it is later sampled by RL.
"""

from __future__ import annotations

from typing import Any


def as_messages(value: Any, role: str = "user") -> list[dict[str, Any]]:
    """A string becomes one message of ``role``; a list of messages is kept as is."""
    return [{"role": role, "content": value}] if isinstance(value, str) else list(value)


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], data_cfg: Any, *, generation_prompt: bool) -> str:
    """``messages`` as the chat template writes them, with the run's ``--data.chat_template_kwargs`` (a thinking
    switch, a reasoning effort) and, with ``generation_prompt``, the next assistant turn's opening."""
    variables = getattr(data_cfg, "chat_template_kwargs", None) or {}
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt, **variables)


def format_prompt(value: Any, data_cfg: Any, tokenizer: Any) -> tuple[str, list[int]]:
    """The prompt text and its token ids (with the tokenizer's special tokens, as the model saw them)."""
    if data_cfg.apply_chat_template:
        text = render_chat(tokenizer, as_messages(value), data_cfg, generation_prompt=True)
        return text, tokenizer(text, add_special_tokens=False)["input_ids"]
    text = data_cfg.input_template.format(value) if data_cfg.input_template else str(value)
    return text, tokenizer(text)["input_ids"]
