"""Environment turns as chat messages on published tokenizers: what the trajectory holds after the model's turn and
the environment's messages is, token for token, the chat template's rendering of the whole conversation."""

from __future__ import annotations

import pytest
from rlhf_agents.chat_turns import ChatTemplateError, chat_feedback, chat_opening

from rlhf.models.loading import load_tokenizer
from rlhf.testing.real_tokenizers import REAL_TOKENIZERS, fetch_tokenizer

#: each family's end-of-turn token, the one its chat models stop at
END_OF_TURN = {"qwen3": "<|im_end|>", "llama3_1": "<|eot_id|>", "gemma3": "<end_of_turn>",
               "deepseek_v3": "<｜end▁of▁sentence｜>"}
QUESTION = [{"role": "user", "content": "Guess my number between 1 and 10. 数字は?"}]
ANSWER = "I guess 7."
REPLY = [{"role": "user", "content": "Higher. Try again."}]


def ids(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.fixture(scope="module", params=sorted(END_OF_TURN))
def tokenizer(request):
    assert request.param in REAL_TOKENIZERS
    return request.param, load_tokenizer(str(fetch_tokenizer(request.param)), "--actor.model_name_or_path")


@pytest.mark.parametrize("stopped", [True, False], ids=["model-closed-its-turn", "turn-cut-by-max-tokens"])
def test_the_trajectory_is_the_templates_rendering_of_the_conversation(tokenizer, stopped: bool) -> None:
    family, tok = tokenizer
    prompt_ids = ids(tok, chat_opening(tok, QUESTION))
    turn = ids(tok, ANSWER) + ([tok.convert_tokens_to_ids(END_OF_TURN[family])] if stopped else [])
    text, feedback = chat_feedback(tok, REPLY, turn, "stop" if stopped else "length")
    whole = tok.apply_chat_template([*QUESTION, {"role": "assistant", "content": ANSWER}, *REPLY], tokenize=False,
                                    add_generation_prompt=True)
    assert prompt_ids + turn + feedback == ids(tok, whole), family
    assert tok.decode(feedback) == text and "Higher. Try again." in text
    assert text.count(END_OF_TURN[family]) == (1 if stopped else 2) or family == "deepseek_v3"


def test_a_template_that_cannot_continue_a_conversation_is_named(tiny_tokenizer_path) -> None:
    from transformers import AutoTokenizer

    plain = AutoTokenizer.from_pretrained(tiny_tokenizer_path)
    plain.chat_template = None
    with pytest.raises(ChatTemplateError, match="chat turns need the policy tokenizer's chat template"):
        chat_feedback(plain, REPLY, [1], "stop")
    # a template that keeps only the last assistant turn (some drop earlier ones)
    plain.chat_template = ("{% for m in messages %}{% if m['role'] != 'assistant' or loop.last %}{{ m['content'] }}"
                           "{% endif %}{% endfor %}")
    with pytest.raises(ChatTemplateError, match="drops or repeats the assistant's turn once a message follows it"):
        chat_feedback(plain, [{"role": "user", "content": "x"}, {"role": "user", "content": "y"}], [1], "stop")


def test_the_runs_template_variables_reach_every_render() -> None:
    """--data.chat_template_kwargs '{"enable_thinking": false}' on Qwen3: the prompt and each environment turn end
    with the empty think block the template writes to switch thinking off, and the trajectory is still the
    template's rendering of the conversation."""
    from rlhf.config.ppo import DataSection
    from rlhf.data.templates import format_prompt

    tok = load_tokenizer(str(fetch_tokenizer("qwen3")), "--actor.model_name_or_path")
    quiet = DataSection(apply_chat_template=True, chat_template_kwargs={"enable_thinking": False})
    thinking, _ = format_prompt(QUESTION[0]["content"], DataSection(apply_chat_template=True), tok)
    text, prompt_ids = format_prompt(QUESTION[0]["content"], quiet, tok)
    assert text == thinking + "<think>\n\n</think>\n\n"
    turn = ids(tok, ANSWER) + [tok.convert_tokens_to_ids("<|im_end|>")]
    feedback_text, feedback = chat_feedback(tok, REPLY, turn, "stop", template_kwargs={"enable_thinking": False})
    assert feedback_text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    assert feedback_text == chat_feedback(tok, REPLY, turn, "stop")[0] + "<think>\n\n</think>\n\n"
    assert chat_opening(tok, QUESTION, {"enable_thinking": False}) == text
