"""``--ds.adam_offload``: Adam states on the CPU (DeepSpeedCPUAdam) train as the default optimizer does.

The first run builds DeepSpeed's ``cpu_adam`` C++ op (about 80 s on 2 cores); torch caches the
build under ``$TORCH_EXTENSIONS_DIR`` (default ``~/.cache/torch_extensions``), so later runs on
the machine, and every later test of a CI run, load it in a second. CI may keep that directory
between runs. Both one-rank runs train in the test's own process: the test is about the optimizer,
not the command's process.
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
    extensions = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")
    assert list(extensions.glob("*/cpu_adam/cpu_adam*.so"))  # DeepSpeedCPUAdam's op was built (or found) and used
    losses = [[m["loss"] for m in read_metrics(run)] for run in (plain, offloaded)]
    assert len(losses[0]) == 3 and losses[1] == pytest.approx(losses[0], rel=1e-4)
    a, b = load_file(plain / "model.safetensors"), load_file(offloaded / "model.safetensors")
    initial = load_file(tiny_causal_lm_path / "model.safetensors")
    for name, tensor in a.items():
        torch.testing.assert_close(b[name], tensor, rtol=0, atol=1e-5, msg=name)
    assert max(float((a[k] - initial[k]).abs().max()) for k in initial) > 1e-3  # both trained
