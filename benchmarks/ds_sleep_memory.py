"""Resident memory of a DeepSpeed-trained model awake and asleep (``--ds.enable_sleep``), per ZeRO stage.

    python benchmarks/ds_sleep_memory.py              # ~50 M-parameter Llama (hidden 768, 9 layers), fp32
    python benchmarks/ds_sleep_memory.py --size tiny

Each stage runs in a fresh single-rank process (gloo, torch's Adam as on every CPU run): two
training steps, then the process's RSS (``/proc/self/status`` VmRSS) awake, after
``SleepingStates.sleep()`` (``DeepSpeedEngine.offload_states``) and after ``wake()``. On a CPU
machine the offload target is host memory too, so the figures show what DeepSpeed's offload does
there: it copies the states into host buffers of the same size and drops only the contiguous
gradient bucket. On a GPU the same calls empty the device (measure with ``torch.cuda.memory_allocated``).

A benchmark, not a test: figures depend on the machine and its allocator.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

SIZES = {"tiny": (128, 2), "50M": (768, 9)}


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def measure(model_dir: str, stage: int) -> dict[str, float]:
    """In this process: two steps, then RSS awake / asleep / awake again."""
    import gc

    os.environ.update(DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT="0", RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0")
    import deepspeed
    import deepspeed.ops
    import torch
    from rlhf_plugin_deepspeed.sleep import SleepingStates
    from transformers import AutoModelForCausalLM
    from transformers.integrations import HfDeepSpeedConfig

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo")
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1, "zero_optimization": {"stage": stage},
              "bf16": {"enabled": False},
              "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True, "foreach": True}}}
    keep_alive = HfDeepSpeedConfig(config)  # noqa: F841 (ZeRO-3 partitioned init)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    states = SleepingStates(engine, True)
    batch = torch.randint(10, 200, (2, 32))
    for _ in range(2):
        engine.backward(engine(input_ids=batch, labels=batch).loss)
        engine.step()
    gc.collect()
    figures = {"awake": rss_mib()}
    states.sleep()
    gc.collect()
    figures["asleep"] = rss_mib()
    states.wake()
    gc.collect()
    figures["woken"] = rss_mib()
    figures["offloaded"] = ", ".join(s.value for s in states.states)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="50M")
    parser.add_argument("--child", nargs=2, metavar=("MODEL_DIR", "STAGE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(measure(args.child[0], int(args.child[1]))))
        return
    from rlhf.testing.tiny import build_causal_lm, build_tokenizer

    hidden, layers = SIZES[args.size]
    with tempfile.TemporaryDirectory() as tmp:
        model = build_causal_lm(Path(tmp) / "model", build_tokenizer(Path(tmp) / "tok"), hidden_size=hidden, layers=layers)
        print(f"model {args.size} (hidden {hidden}, {layers} layers), fp32, one CPU rank; RSS in MiB")
        print("| ZeRO stage | awake | asleep | woken again | states offloaded |\n|---|---|---|---|---|")
        for stage in (2, 3):
            out = subprocess.run([sys.executable, __file__, "--child", str(model), str(stage)], capture_output=True,
                                 text=True, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"| {stage} | {row['awake']:.0f} | {row['asleep']:.0f} | {row['woken']:.0f} | {row['offloaded']} |")


if __name__ == "__main__":
    main()
