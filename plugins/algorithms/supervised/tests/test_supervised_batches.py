"""Supervised batches: packed equals padded, and loss masks cover exactly the trained tokens."""

from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch
from rlhf_supervised.batch import at_last_token, collate, per_sample_sum, token_logprobs
from rlhf_supervised.conversations import conversation, preference_pair, prompt_response
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

from rlhf.config.base import ConfigError
from rlhf.errors import DataError
from rlhf.models.loading import token_values


def _random_sequences(seed: int, count: int, vocab: int) -> tuple[list[list[int]], list[list[int]]]:
    rng = random.Random(seed)
    seqs = [[rng.randrange(10, vocab) for _ in range(rng.randint(3, 17))] for _ in range(count)]
    masks = [[rng.randint(0, 1) for _ in s] for s in seqs]
    return seqs, masks


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logits_equal_padded_logits(tiny_causal_lm_path, attn) -> None:
    model = AutoModelForCausalLM.from_pretrained(tiny_causal_lm_path, dtype=torch.float32, attn_implementation=attn).eval()
    seqs, masks = _random_sequences(0, 5, model.config.vocab_size)
    padded = collate(seqs, masks, pad_id=3, packed=False)
    packed = collate(seqs, masks, pad_id=3, packed=True)
    assert packed.input_ids.shape == (1, sum(len(s) for s in seqs)) and packed.attention_mask is None
    with torch.no_grad():
        padded_logits = model(**padded.model_inputs()).logits
        packed_logits = model(**packed.model_inputs()).logits
    offset = 0
    for i, seq in enumerate(seqs):
        torch.testing.assert_close(packed_logits[0, offset : offset + len(seq)], padded_logits[i, : len(seq)],
                                   rtol=1e-4, atol=1e-4)
        offset += len(seq)
    torch.testing.assert_close(per_sample_sum(token_logprobs(packed_logits, packed), packed),
                               per_sample_sum(token_logprobs(padded_logits, padded), padded), rtol=1e-4, atol=1e-4)
    # a sample's first token is never trained: in a packed row it would be predicted from the previous sample
    assert packed.loss_mask.sum() == padded.loss_mask.sum() == sum(sum(m[1:]) for m in masks)


def test_packing_does_not_leak_between_samples(tiny_causal_lm_path) -> None:
    """Changing one sample leaves the logits of every other sample in the packed row untouched."""
    model = AutoModelForCausalLM.from_pretrained(tiny_causal_lm_path, dtype=torch.float32, attn_implementation="sdpa").eval()
    seqs, masks = _random_sequences(1, 3, model.config.vocab_size)
    changed = [seqs[0][:-1] + [seqs[0][-1] + 1], *seqs[1:]]
    with torch.no_grad():
        a = model(**collate(seqs, masks, 3, packed=True).model_inputs()).logits
        b = model(**collate(changed, masks, 3, packed=True).model_inputs()).logits
    start = len(seqs[0])
    torch.testing.assert_close(a[0, start:], b[0, start:])


def test_value_at_last_token_packed_equals_padded_and_hf_pooling(tiny_reward_model_path) -> None:
    model = AutoModelForSequenceClassification.from_pretrained(tiny_reward_model_path, dtype=torch.float32).eval()
    seqs, masks = _random_sequences(2, 4, model.config.vocab_size)
    pad = model.config.pad_token_id
    padded, packed = collate(seqs, masks, pad, packed=False), collate(seqs, masks, pad, packed=True)
    with torch.no_grad():
        a = at_last_token(token_values(model, padded.input_ids, padded.attention_mask), padded)
        b = at_last_token(token_values(model, packed.input_ids, position_ids=packed.position_ids), packed)
        hf = model(input_ids=padded.input_ids, attention_mask=padded.attention_mask).logits.squeeze(-1)
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(a, hf, rtol=1e-4, atol=1e-4)


def _data_cfg(**kw):
    base = dict(apply_chat_template=True, input_template=None, prompt_key="prompt", chosen_key="chosen",
                rejected_key="rejected", margin_key=None)
    return SimpleNamespace(**{**base, **kw})


def _trained_text(tokenizer, ids, mask) -> str:
    return tokenizer.decode([t for t, m in zip(ids, mask) if m])


def test_multiturn_mask_covers_every_assistant_turn_only(tiny_tokenizer_path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_path)
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "what is 2+3?"},
        {"role": "assistant", "content": "5"},
        {"role": "user", "content": "and times 4?"},
        {"role": "assistant", "content": "the answer is 20"},
    ]
    ids, mask = conversation(messages, tokenizer, "chat.jsonl", 0)
    assert ids == tokenizer(tokenizer.apply_chat_template(messages, tokenize=False), add_special_tokens=False)["input_ids"]
    assert _trained_text(tokenizer, ids, mask) == "5</s>the answer is 20</s>"
    # every trained span starts right after the <|assistant|> marker
    assistant = tokenizer.convert_tokens_to_ids("<|assistant|>")
    starts = [i for i in range(len(mask)) if mask[i] and not mask[i - 1]]
    assert len(starts) == 2 and all(ids[i - 1] == assistant for i in starts)


def test_multiturn_errors_name_the_row(tiny_tokenizer_path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_path)
    with pytest.raises(ConfigError, match="chat.jsonl row 7: the conversation has no assistant turn"):
        conversation([{"role": "user", "content": "hi"}], tokenizer, "chat.jsonl", 7)
    with pytest.raises(ConfigError, match="row 3: --data.multiturn needs a list"):
        conversation("just text", tokenizer, "chat.jsonl", 3)


@pytest.mark.parametrize("chat", [True, False])
def test_prompt_response_mask_is_the_response_and_eos(tiny_tokenizer_path, chat) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_path)
    cfg = _data_cfg(apply_chat_template=chat, input_template="User: {}\nAssistant: ")
    ids, mask = prompt_response("what is 1+1?", "2 because 1+1=2", cfg, tokenizer)
    assert _trained_text(tokenizer, ids, mask) == "2 because 1+1=2</s>"
    assert mask[0] == 0 and ids[-1] == tokenizer.eos_token_id


def test_preference_pair_shares_the_prompt_and_reports_missing_keys(tiny_tokenizer_path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_path)
    pair = preference_pair({"prompt": "2+2?", "chosen": "4", "rejected": "5"}, _data_cfg(), tokenizer, "p.jsonl", 0)
    prompt_len = pair["chosen_mask"].index(1)
    assert pair["chosen_ids"][:prompt_len] == pair["rejected_ids"][:prompt_len]
    assert _trained_text(tokenizer, pair["rejected_ids"], pair["rejected_mask"]) == "5</s>"
    with pytest.raises(DataError, match=r"p.jsonl row 4 has no key 'rejected' \(keys: prompt, chosen\); set --data.rejected_key"):
        preference_pair({"prompt": "x", "chosen": "y"}, _data_cfg(), tokenizer, "p.jsonl", 4)
