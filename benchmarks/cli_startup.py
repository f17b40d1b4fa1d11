"""Wall time of the light `rlhf` commands (goal: under 1.5 s each).

    python benchmarks/cli_startup.py [--repeat 5]

Runs each command in a fresh interpreter, as a user would, and prints the median
and best wall time. A benchmark, not a test: timings depend on the machine's load.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time

COMMANDS = {
    "rlhf --help": ["--help"],
    "rlhf plugins": ["plugins"],
    "rlhf plugins --json": ["plugins", "--json"],
    "rlhf train ppo --help": ["train", "ppo", "--help"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    exe = shutil.which("rlhf")
    base = [exe] if exe else [sys.executable, "-m", "rlhf"]
    print(f"{'command':<24} {'median s':>9} {'best s':>8}   ({args.repeat} runs, {' '.join(base)})")
    for label, argv in COMMANDS.items():
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            subprocess.run([*base, *argv], check=True, capture_output=True)
            times.append(time.perf_counter() - start)
        print(f"{label:<24} {statistics.median(times):>9.3f} {min(times):>8.3f}")


if __name__ == "__main__":
    main()
