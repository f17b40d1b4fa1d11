"""SFT step time and token throughput with and without ``--ds.packing_samples`` on tiny models.

    python benchmarks/sft_packing.py [--rows 256] [--micro 16]

Builds a tiny Llama and tokenizer offline, writes SFT rows whose responses vary from a
few to ~100 tokens (where padding costs the most), runs ``rlhf train sft`` padded and
packed, and prints the median step time and tokens/s from each run's metrics.jsonl
(steps after the first, which pays warm-up). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
from pathlib import Path

from rlhf.testing.cli import assert_ok, run_rlhf
from rlhf.testing.tiny import build_causal_lm, build_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=256)
    parser.add_argument("--micro", type=int, default=16)
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="rlhf-bench-"))
    model = build_causal_lm(root / "model", build_tokenizer(root / "tok"))
    rng = random.Random(0)
    with (root / "sft.jsonl").open("w") as handle:
        for _ in range(args.rows):
            words = " ".join(rng.choice(["the", "answer", "is", "so", "because"]) for _ in range(rng.randint(1, 60)))
            handle.write(json.dumps({"input": f"what is {rng.randint(1, 99)}?", "output": words}) + "\n")
    print(f"{'mode':<8} {'step s':>8} {'tokens/s':>10}")
    for mode, extra in (("padded", []), ("packed", ["--ds.packing_samples"])):
        out = root / mode
        assert_ok(run_rlhf("train", "sft", "--model.model_name_or_path", str(model), "--data.dataset", str(root / "sft.jsonl"),
                           "--train.batch_size", str(args.micro * 4), "--train.micro_batch_size", str(args.micro),
                           "--train.max_epochs", "1", "--ds.param_dtype", "fp32", "--ckpt.output_dir", str(out), *extra))
        steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][1:]
        steps = [s for s in steps if "timing/step" in s]
        print(f"{mode:<8} {statistics.median(s['timing/step'] for s in steps):>8.3f} "
              f"{statistics.median(s['throughput/tokens_per_s'] for s in steps):>10.0f}")


if __name__ == "__main__":
    main()
