"""DeepSpeed's deepcompile against eager on one GPU: the same SFT run (ZeRO-3, fp32, a tiny Llama) twice.

    python benchmarks/deepcompile.py [--rows 48] [--work DIR]

The first compiled step JIT-builds DeepSpeed's deepcompile op (nvcc, on a cold torch-extensions cache) and compiles
the model, which is longer than a test's time limit; so this comparison is a benchmark, run by
``scripts/gpu_check.sh --extended``. It prints each run's wall time, first step and median later step
(``timing/step``), and whether the compiled losses are the eager ones (rel 1e-3); it exits 1 when they are not.
A benchmark otherwise: the times depend on the machine and its caches.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rlhf.records.metrics import read_metrics
from rlhf.testing.cli import assert_ok, run_rlhf
from rlhf.testing.tiny import build_causal_lm, build_tokenizer


def sft(root: Path, model: Path, name: str, *extra: str) -> tuple[float, list[dict]]:
    """Wall seconds of one ``rlhf train sft`` and its per-step metrics."""
    started = time.perf_counter()
    assert_ok(run_rlhf("train", "sft", "--model.model_name_or_path", str(model), "--data.dataset", str(root / "sft.jsonl"),
                       "--train.batch_size", "8", "--train.micro_batch_size", "2", "--train.max_epochs", "1",
                       "--adam.lr", "1e-3", "--ds.param_dtype", "fp32", "--ds.zero_stage", "3",
                       "--ds.attn_implementation", "eager", "--ckpt.output_dir", str(root / name), *extra, timeout=900))
    return time.perf_counter() - started, read_metrics(root / name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=48, help="SFT rows (8 a step)")
    parser.add_argument("--work", type=Path, help="where the model and runs go (default: a temporary directory)")
    args = parser.parse_args()
    import torch

    if not torch.cuda.is_available():
        print(f"deepcompile.py: error: torch {torch.__version__} sees no CUDA GPU on this machine; --ds.deepcompile "
              "needs one", file=sys.stderr)
        raise SystemExit(2)
    root = args.work or Path(tempfile.mkdtemp(prefix="rlhf-deepcompile-"))
    root.mkdir(parents=True, exist_ok=True)
    model = build_causal_lm(root / "model", build_tokenizer(root / "tok"))
    rng = random.Random(0)
    (root / "sft.jsonl").write_text("".join(json.dumps({"input": f"what is {a}+{b}?", "output": str(a + b)}) + "\n"
                                            for a, b in ((rng.randint(1, 99), rng.randint(1, 99)) for _ in range(args.rows))))
    print(f"{'mode':<9} {'wall s':>7} {'first step s':>13} {'later steps s':>14}")
    losses = {}
    for mode, extra in (("eager", ()), ("compiled", ("--ds.deepcompile",))):
        wall, steps = sft(root, model, mode, *extra)
        losses[mode] = [s["loss"] for s in steps]
        times = [s["timing/step"] for s in steps if "timing/step" in s]
        later = f"{statistics.median(times[1:]):.3f}" if len(times) > 1 else "-"
        print(f"{mode:<9} {wall:>7.1f} {times[0] if times else float('nan'):>13.3f} {later:>14}", flush=True)
    same = len(losses["eager"]) == len(losses["compiled"]) and all(
        abs(c - e) <= 1e-3 * abs(e) for e, c in zip(losses["eager"], losses["compiled"]))
    print(f"losses {'agree' if same else 'differ'} (rel 1e-3): eager {losses['eager']}, compiled {losses['compiled']}")
    raise SystemExit(0 if same else 1)


if __name__ == "__main__":
    main()
