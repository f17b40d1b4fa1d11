"""The demo's verifiable task: two-digit addition, character by character.

Prompt ``<s>47+85=``, answer ``132</s>``; the reward is exact match of the
response with the sum. Everything is built locally: a character-level tokenizer,
a ~0.4 M-parameter Llama, train and held-out prompt sets that never overlap.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

CHARS = list("0123456789+=")
SPECIALS = ["<pad>", "<s>", "</s>", "<unk>"]

#: The reward file the RL run loads through ``--reward.remote_url`` (OpenRLHF's contract).
REWARD_FILE = '''"""Exact-match reward of the rlhf demo: 1 when the response is the correct sum, else 0."""


def reward_func(queries, prompts, labels, **kwargs):
    responses = [query[len(prompt):].replace("</s>", "").strip() for query, prompt in zip(queries, prompts)]
    rewards = [float(response == str(label)) for response, label in zip(responses, labels)]
    return {"rewards": rewards, "scores": rewards}
'''


def build_tokenizer(path: Path, vocab_size: int | None = None) -> Any:
    """The task's character tokenizer, saved to ``path``; ``vocab_size``: padded with filler tokens that never occur
    in text, so that a model of a realistic vocabulary (a memory benchmark's) reads the same prompts."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tokens = SPECIALS + CHARS
    tokens += [f"<f{i}>" for i in range((vocab_size or len(tokens)) - len(tokens))]
    vocab = {token: i for i, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", vocab["<s>"])])
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                      unk_token="<unk>")
    wrapped.save_pretrained(path)
    return wrapped


def build_model(tokenizer: Any, seed: int, max_positions: int = 64) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=128, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=4, max_position_embeddings=max_positions, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    return LlamaForCausalLM(config)


def split_problems(seed: int, held_out: int = 200) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """All 8100 operand pairs 10..99, shuffled; the first ``held_out`` are never trained on."""
    pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
    random.Random(seed).shuffle(pairs)
    return pairs[held_out:], pairs[:held_out]


def prompt_of(a: int, b: int) -> str:
    return f"{a}+{b}="


def write_prompt_file(path: Path, pairs: list[tuple[int, int]], count: int, seed: int) -> None:
    import json

    rng = random.Random(seed)
    with path.open("w") as handle:
        for _ in range(count):
            a, b = rng.choice(pairs)
            handle.write(json.dumps({"input": prompt_of(a, b), "label": str(a + b)}) + "\n")


def accuracy(model: Any, tokenizer: Any, pairs: list[tuple[int, int]], *, sample: bool = False, seed: int = 0) -> float:
    """Exact-match accuracy on ``pairs``: greedy by default, or one temperature-1 sample each."""
    import torch

    model.eval()
    prompts = [tokenizer(prompt_of(a, b))["input_ids"] for a, b in pairs]
    width = max(len(p) for p in prompts)
    input_ids = torch.full((len(prompts), width), tokenizer.pad_token_id, dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    for i, p in enumerate(prompts):
        input_ids[i, width - len(p):] = torch.tensor(p)
        attention[i, width - len(p):] = 1
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=attention, max_new_tokens=5, do_sample=sample,
                             temperature=1.0 if sample else None, top_p=None, top_k=0 if sample else None,
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    texts = tokenizer.batch_decode(out[:, width:], skip_special_tokens=True)
    return sum(text.strip() == str(a + b) for text, (a, b) in zip(texts, pairs)) / len(pairs)


def supervised_warm_start(model: Any, tokenizer: Any, pairs: list[tuple[int, int]], held_out: list[tuple[int, int]],
                          *, target: float, seed: int, max_seconds: float = 120.0) -> tuple[int, float]:
    """Plain next-token training on ``a+b=sum</s>`` until held-out greedy accuracy reaches ``target``.

    Stopping at an accuracy threshold (not a step count) gives RL a steadier start.
    Returns (steps, accuracy reached).
    """
    import time

    import torch

    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    start, step, reached = time.perf_counter(), 0, 0.0
    probe = held_out[:100]
    while time.perf_counter() - start < max_seconds:
        model.train()
        batch = [rng.choice(pairs) for _ in range(128)]
        texts = [f"{prompt_of(a, b)}{a + b}" for a, b in batch]
        encoded = tokenizer(texts, padding=True, return_tensors="pt")
        ids = torch.cat([encoded["input_ids"], torch.full((len(texts), 1), tokenizer.pad_token_id)], dim=1)
        lengths = encoded["attention_mask"].sum(dim=1)
        ids[torch.arange(len(texts)), lengths] = tokenizer.eos_token_id
        labels = ids.clone()
        labels[ids == tokenizer.pad_token_id] = -100
        prompt_len = len(tokenizer(prompt_of(*batch[0]))["input_ids"])  # all prompts have the same length
        labels[:, :prompt_len] = -100
        loss = model(input_ids=ids, attention_mask=(ids != tokenizer.pad_token_id).long(), labels=labels).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        step += 1
        if step % 25 == 0:
            reached = accuracy(model, tokenizer, probe)
            if reached >= target:
                break
    return step, reached
