"""The sample table of a running step, printed above the progress bar."""

from __future__ import annotations

import sys
from typing import Any

from rlhf.records.rollouts import shown_samples
from rlhf_plugin_rollouts.table import rendered, sample_table


def print_samples(step: int, kind: str, samples: list[dict[str, Any]], count: int) -> None:
    """``count`` of ``samples`` on stdout. Through ``tqdm.write``, which clears the progress bar (on stderr) first and
    redraws it after, so the bar stays one line under the table instead of being torn by it."""
    from tqdm import tqdm

    shown = shown_samples(samples, count)
    title = f"step {step} {'evaluation ' if kind == 'eval' else ''}samples ({len(shown)} of {len(samples)})"
    tqdm.write(rendered(sample_table(shown, title), terminal=sys.stdout.isatty()), file=sys.stdout)
