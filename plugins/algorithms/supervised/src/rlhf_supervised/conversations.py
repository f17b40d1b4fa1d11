"""Token ids with loss masks for supervised data: prompt + response, whole conversations, raw text.

A mask value of 1 marks a token the model is trained to predict (response or assistant
tokens); 0 marks context. Prompt and response are tokenized separately and joined, so a
BPE merge can never move the boundary between them.
"""

from __future__ import annotations

from typing import Any

from rlhf.config.base import ConfigError
from rlhf.data.sources import text_value
from rlhf.data.templates import as_messages, format_prompt, render_chat


def _ids(tokenizer: Any, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _with_eos(ids: list[int], tokenizer: Any) -> list[int]:
    eos = tokenizer.eos_token_id
    return ids if (ids and ids[-1] == eos) or eos is None else ids + [eos]


def _through_eos(ids: list[int], tokenizer: Any) -> list[int]:
    """A templated response up to its end-of-turn: what the template writes after the EOS (Qwen's and Gemma's
    newline between turns) is never sampled, since generation stops at the EOS, and an EOS added after it taught
    the model to end a turn twice (``<|im_end|>\n<|im_end|>``)."""
    eos = tokenizer.eos_token_id
    if eos in ids:
        return ids[: len(ids) - ids[::-1].index(eos)]
    return _with_eos(ids, tokenizer)


def response_ids(prompt_value: Any, response_value: Any, data_cfg: Any, tokenizer: Any) -> list[int]:
    """The response's token ids, ending with EOS, rendered the way the prompt was (chat template or plain)."""
    if data_cfg.apply_chat_template:
        prompt_messages = as_messages(prompt_value)
        prompt_text = render_chat(tokenizer, prompt_messages, data_cfg, generation_prompt=True)
        full = render_chat(tokenizer, prompt_messages + as_messages(response_value, "assistant"), data_cfg,
                           generation_prompt=False)
        if not full.startswith(prompt_text):
            raise ConfigError("the chat template renders the prompt differently once a response follows; "
                              "use --data.input_template instead of --data.apply_chat_template")
        return _through_eos(_ids(tokenizer, full[len(prompt_text):]), tokenizer)
    text = response_value if isinstance(response_value, str) else as_messages(response_value)[-1]["content"]
    return _with_eos(_ids(tokenizer, text), tokenizer)


def prompt_response(prompt_value: Any, response_value: Any, data_cfg: Any, tokenizer: Any) -> tuple[list[int], list[int]]:
    """``(ids, loss_mask)`` of one prompt + response: the mask covers the response (and its EOS) only."""
    _, prompt = format_prompt(prompt_value, data_cfg, tokenizer)
    response = response_ids(prompt_value, response_value, data_cfg, tokenizer)
    return prompt + response, [0] * len(prompt) + [1] * len(response)


def row_prompt_response(row: dict[str, Any], data_cfg: Any, tokenizer: Any, source: str,
                        index: int) -> tuple[list[int], list[int]]:
    """:func:`prompt_response` of a row's ``--data.input_key`` and ``--data.output_key`` values."""

    prompt = text_value(row, data_cfg.input_key, "--data.input_key", source, index)
    response = text_value(row, data_cfg.output_key, "--data.output_key", source, index)
    return prompt_response(prompt, response, data_cfg, tokenizer)


def pretrain_text(text: str, tokenizer: Any) -> tuple[list[int], list[int]]:
    """``--model.pretrain_mode_enable``: every token is trained (the first one has nothing to be predicted from)."""
    ids = _with_eos(tokenizer(text)["input_ids"], tokenizer)
    return ids, [1] * len(ids)


def conversation(messages: list[dict[str, Any]], tokenizer: Any, source: str, index: int,
                 data_cfg: Any = None) -> tuple[list[int], list[int]]:
    """``--data.multiturn``: the whole chat through the template, trained on every assistant turn only.

    The text is cut where each assistant turn starts and ends in the rendered conversation
    (found by rendering the prefixes), and each piece is tokenized on its own.
    """
    if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
        raise ConfigError(f"{source} row {index}: --data.multiturn needs a list of {{role, content}} messages")
    full = render_chat(tokenizer, messages, data_cfg, generation_prompt=False)
    cuts: list[tuple[int, int]] = []
    for turn, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before = render_chat(tokenizer, messages[:turn], data_cfg, generation_prompt=True)
        through = render_chat(tokenizer, messages[: turn + 1], data_cfg, generation_prompt=False)
        if not (full.startswith(before) and full.startswith(through)):
            raise ConfigError(f"{source} row {index}: the chat template does not render conversation prefixes as "
                              "prefixes, so assistant turns cannot be located; --data.multiturn needs such a template")
        cuts.append((len(before), len(through)))
    if not cuts:
        raise ConfigError(f"{source} row {index}: the conversation has no assistant turn to train on")
    ids: list[int] = []
    mask: list[int] = []
    position = 0
    for start, end in cuts:
        context = _ids(tokenizer, full[position:start]) if start > position else []
        answer = _ids(tokenizer, full[start:end])
        ids += context + answer
        mask += [0] * len(context) + [1] * len(answer)
        position = end
    if position < len(full):
        tail = _ids(tokenizer, full[position:])
        ids += tail
        mask += [0] * len(tail)
    return ids, mask


def preference_pair(row: dict[str, Any], data_cfg: Any, tokenizer: Any, source: str, index: int) -> dict[str, Any]:
    """One preference row -> chosen/rejected ``ids`` and ``mask`` (+ ``margin``), for RM and DPO-style trainers.

    With ``--data.prompt_key`` the prompt is templated once and each response follows it
    (masks cover the responses); without it, chosen and rejected are complete texts or
    conversations and every token counts.
    """

    chosen = text_value(row, data_cfg.chosen_key, "--data.chosen_key", source, index)
    rejected = text_value(row, data_cfg.rejected_key, "--data.rejected_key", source, index)
    sides = {}
    for name, value in (("chosen", chosen), ("rejected", rejected)):
        if data_cfg.prompt_key:
            prompt = text_value(row, data_cfg.prompt_key, "--data.prompt_key", source, index)
            ids, mask = prompt_response(prompt, value, data_cfg, tokenizer)
        elif data_cfg.apply_chat_template and not isinstance(value, str):
            ids = _through_eos(_ids(tokenizer, render_chat(tokenizer, value, data_cfg, generation_prompt=False)), tokenizer)
            mask = [1] * len(ids)
        else:
            ids = _with_eos(tokenizer(str(value))["input_ids"], tokenizer)
            mask = [1] * len(ids)
        sides[name] = (ids, mask)
    margin = float(row[data_cfg.margin_key]) if data_cfg.margin_key and row.get(data_cfg.margin_key) is not None else 0.0
    return {"chosen_ids": sides["chosen"][0], "chosen_mask": sides["chosen"][1], "rejected_ids": sides["rejected"][0],
            "rejected_mask": sides["rejected"][1], "margin": margin,
            "length": max(len(sides["chosen"][0]), len(sides["rejected"][0]))}
