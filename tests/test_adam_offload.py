"""``--ds.adam_offload``: Adam states on the CPU (DeepSpeedCPUAdam) train as the default optimizer does.

The first run builds DeepSpeed's ``cpu_adam`` C++ op: about 150 CPU-s, 90 % of the test (2-3 min of wall
on 2 cores; the test without it is about 13 CPU-s). torch caches the build under ``$TORCH_EXTENSIONS_DIR``
(default ``~/.cache/torch_extensions/py311_cpu``), so later runs load it in a second; CI may keep that
directory between runs. The cache is one folder per op name and the build's command names the sources by
their path in the environment, so a checkout in another path (another venv, a git worktree) builds the op
again, over the other's build. Both one-rank runs train in the test's own process: the test is about the
optimizer, not the command's process.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlhf.records.metrics import read_metrics
from rlhf.testing.cli import assert_ok, run_in_process

pytestmark = pytest.mark.slow


def built_cpu_adam_ops() -> list[Path]:
    """The ``cpu_adam`` op's builds where torch keeps them: ``$TORCH_EXTENSIONS_DIR/cpu_adam`` when that is set, else
    one folder per build flavour (``py311_cpu``, ``py311_cu124``...) under the user's cache."""
    from torch.utils.cpp_extension import get_default_build_root

    if os.environ.get("TORCH_EXTENSIONS_DIR"):
        return list(Path(os.environ["TORCH_EXTENSIONS_DIR"]).glob("cpu_adam/cpu_adam*.so"))
    return list(Path(get_default_build_root()).glob("*/cpu_adam/cpu_adam*.so"))


def test_offloaded_adam_trains_like_the_default_optimizer(tmp_path: Path, tiny_causal_lm_path: Path) -> None:
    rng = random.Random(0)
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"input": f"what is {a}+{b}?", "output": str(a + b)}) + "\n"
                            for a, b in ((rng.randint(1, 99), rng.randint(1, 99)) for _ in range(24))))

    def train(name: str, *extra: str) -> Path:
        out = tmp_path / name
        assert_ok(run_in_process("train", "sft", "--model.model_name_or_path", str(tiny_causal_lm_path),
                                 "--data.dataset", str(data), "--train.batch_size", "8", "--train.micro_batch_size", "4",
                                 "--train.max_epochs", "1", "--adam.lr", "1e-3", "--ds.param_dtype", "fp32",
                                 "--ds.zero_stage", "2", "--ds.attn_implementation", "eager",
                                 "--ckpt.output_dir", str(out), *extra))
        return out

    plain, offloaded = train("plain"), train("offloaded", "--ds.adam_offload")
    assert built_cpu_adam_ops()  # DeepSpeedCPUAdam's op was built (or found) and used
    losses = [[m["loss"] for m in read_metrics(run)] for run in (plain, offloaded)]
    assert len(losses[0]) == 3 and losses[1] == pytest.approx(losses[0], rel=1e-4)
    a, b = load_file(plain / "model.safetensors"), load_file(offloaded / "model.safetensors")
    initial = load_file(tiny_causal_lm_path / "model.safetensors")
    for name, tensor in a.items():
        torch.testing.assert_close(b[name], tensor, rtol=0, atol=1e-5, msg=name)
    assert max(float((a[k] - initial[k]).abs().max()) for k in initial) > 1e-3  # both trained
