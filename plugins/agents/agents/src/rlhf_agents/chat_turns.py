"""Environment turns as chat messages, rendered by the policy's own chat template, token-exact.

An environment that answers ``environment_messages`` (a user turn, a tool result) gets them templated as the model
will see them in a conversation, instead of raw text glued after the assistant's turn. The trajectory is never
re-tokenized: the model's sampled ids stay as they were, and only the text the template puts between the end of
the assistant's content and the next generation prompt is tokenized here. That text is found by rendering a
conversation whose assistant content is a marker, followed by the new messages and the generation prompt: what
follows the marker is the assistant turn's closing (e.g. ``<|im_end|>\\n``), the new messages and the prompt.
Where the model's turn already ended with that closing token (it stopped at its end-of-turn), the closing is not
added twice. The OpenAI-server executor continues its chat sessions the same way.
"""

from __future__ import annotations

from typing import Any

#: stands for the assistant's content while the template is rendered; no template changes or escapes it
_MARKER = "\u2063rlhf-assistant-content\u2063"
_OPENING = [{"role": "user", "content": "."}, {"role": "assistant", "content": _MARKER}]


class ChatTemplateError(ValueError):
    """The tokenizer's chat template cannot append turns to a conversation (it has none, or it renders the earlier
    turns differently once a message follows them)."""


def chat_feedback(tokenizer: Any, messages: list[dict[str, Any]], last_turn_ids: list[int], finish_reason: str,
                  tools: list[dict[str, Any]] | None = None,
                  template_kwargs: dict[str, Any] | None = None) -> tuple[str, list[int]]:
    """``(text, ids)`` to append after the model's turn ``last_turn_ids`` so that the trajectory continues as
    ``messages`` rendered by the chat template, ending with the next assistant turn's generation prompt (``tools``:
    the tool definitions the conversation was rendered with, for templates whose turns depend on them;
    ``template_kwargs``: the run's ``--data.chat_template_kwargs``)."""
    if not getattr(tokenizer, "chat_template", None):
        raise ChatTemplateError("chat turns need the policy tokenizer's chat template, and it has none")
    try:
        continued = tokenizer.apply_chat_template([*_OPENING, *messages], tokenize=False, add_generation_prompt=True,
                                                  **({"tools": tools} if tools else {}), **(template_kwargs or {}))
    except Exception as exc:  # noqa: BLE001 - jinja's errors (a role the template refuses, a raise_exception) are the messages'
        raise ChatTemplateError(f"the chat template refused environment_messages: {type(exc).__name__}: {exc}") from exc
    if continued.count(_MARKER) != 1:
        raise ChatTemplateError("the chat template drops or repeats the assistant's turn once a message follows it, so "
                                "turns cannot be appended token-exactly; answer environment_feedback text instead")
    # only what follows the content counts: how the template opens an earlier assistant turn (Qwen3 drops the empty
    # think block it gives the last one) is not in the trajectory, which holds the model's own turn
    text = continued[continued.index(_MARKER) + len(_MARKER):]
    if finish_reason == "stop" and last_turn_ids:
        emitted = tokenizer.decode(last_turn_ids[-1:], skip_special_tokens=False)
        if emitted and text.startswith(emitted):  # the model closed its own turn: keep its token, not a second one
            text = text[len(emitted):]
    return text, tokenizer(text, add_special_tokens=False)["input_ids"]


def chat_opening(tokenizer: Any, messages: list[dict[str, Any]], template_kwargs: dict[str, Any] | None = None) -> str:
    """The first observation of an episode whose ``reset`` answered ``messages``: templated for generation."""
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             **(template_kwargs or {}))
    except Exception as exc:  # noqa: BLE001 - as above
        raise ChatTemplateError(f"the chat template refused reset's messages: {type(exc).__name__}: {exc}") from exc
