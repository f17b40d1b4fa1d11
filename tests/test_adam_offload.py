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
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlhf.records.metrics import read_metrics
from rlhf.testing.cli import assert_ok, run_in_process

pytestmark = pytest.mark.slow


def loaded_cpu_adam_ops() -> set[str]:
    """The files of DeepSpeed's ``cpu_adam`` op mapped into this process, where both runs train (wherever torch built
    or found it: ``$TORCH_EXTENSIONS_DIR/cpu_adam`` or ``~/.cache/torch_extensions/<flavour>/cpu_adam``)."""
    return {line.split()[-1] for line in Path("/proc/self/maps").read_text().splitlines()
            if "/cpu_adam" in line and line.endswith(".so")}


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

    plain = train("plain")
    assert not loaded_cpu_adam_ops()  # the default optimizer needs no C++ op
    offloaded = train("offloaded", "--ds.adam_offload")
    assert loaded_cpu_adam_ops()  # DeepSpeedCPUAdam's op was built (or found in torch's cache) and loaded
    losses = [[m["loss"] for m in read_metrics(run)] for run in (plain, offloaded)]
    assert len(losses[0]) == 3 and losses[1] == pytest.approx(losses[0], rel=1e-4)
    a, b = load_file(plain / "model.safetensors"), load_file(offloaded / "model.safetensors")
    initial = load_file(tiny_causal_lm_path / "model.safetensors")
    for name, tensor in a.items():
        torch.testing.assert_close(b[name], tensor, rtol=0, atol=1e-5, msg=name)
    assert max(float((a[k] - initial[k]).abs().max()) for k in initial) > 1e-3  # both trained
