"""Samples as a rich table: prompt and response cut to fit, each reward term, the total, advantage, length,
finish reason and the columns plugins added. The run's console table and ``rlhf rollouts show`` draw the same."""

from __future__ import annotations

import io
import shutil
from typing import Any

from rlhf.records.rollouts import EXTRA_PREFIX, TERM_PREFIX

#: characters kept of each text cell: the prompt's end (where the question is), the response's start
PROMPT_CHARS, RESPONSE_CHARS, EXTRA_CHARS = 48, 96, 40
#: the width of a table written to a file or a pipe (a log wraps nothing; a terminal gets its own width)
FILE_WIDTH = 160


def cut(text: Any, limit: int, *, tail: bool = False) -> str:
    """``text`` on one line, at most ``limit`` characters (its end when ``tail``), an ellipsis where cut."""
    flat = str(text).replace("\r", "").replace("\n", "⏎")
    if len(flat) <= limit:
        return flat
    return "…" + flat[-(limit - 1):] if tail else flat[: limit - 1] + "…"


def _number(value: Any) -> str:
    return "" if value is None else f"{value:.3g}" if isinstance(value, float) else str(value)


def sample_table(samples: list[dict[str, Any]], title: str, *, with_step: bool = False, with_mismatch: bool = False) -> Any:
    """A ``rich.table.Table`` of ``samples`` (records of :data:`rlhf.records.rollouts.COLUMNS`)."""
    from rich.table import Table
    from rich.text import Text

    terms = _keys(samples, TERM_PREFIX)
    extras = _keys(samples, EXTRA_PREFIX)
    # numbers keep their width; the texts share what is left (the sample most), folded where they run out. The
    # prompt's end and the response stack in one column, so a narrow terminal still gives the response room.
    table = Table(title=title, title_justify="left", expand=True, show_lines=True)
    if with_step:
        table.add_column("step", justify="right", no_wrap=True)
    table.add_column("grp", justify="right", no_wrap=True)
    table.add_column("prompt ⏵ response", overflow="fold", ratio=4, min_width=20)
    for term in terms:  # a long term name folds in its header; its numbers never do
        table.add_column(term[len(TERM_PREFIX):], justify="right", min_width=6)
    table.add_column("reward", justify="right", no_wrap=True)
    table.add_column("adv", justify="right", no_wrap=True)
    table.add_column("len", justify="right", no_wrap=True)
    table.add_column("finish", no_wrap=True)
    if with_mismatch:
        table.add_column("|Δlogp|", justify="right", no_wrap=True)
    for extra in extras:
        table.add_column(extra[len(EXTRA_PREFIX):], overflow="fold", ratio=2, min_width=10)
    for sample in samples:
        row = [str(sample["step"])] if with_step else []
        row += [str(sample["group"]), Text.assemble((cut(sample["prompt"], PROMPT_CHARS, tail=True), "dim"), "\n",
                                                    cut(sample["response"], RESPONSE_CHARS))]
        row += [_number(sample.get(term)) for term in terms]
        row += [_number(sample["reward"]), _number(sample["advantage"]), str(sample["response_length"]),
                sample["finish_reason"]]
        if with_mismatch:
            row.append(_number(sample.get("logprob_mismatch")))
        row += [cut(_number(sample.get(extra)), EXTRA_CHARS) for extra in extras]
        table.add_row(*row)
    return table


def rendered(table: Any, *, terminal: bool) -> str:
    """The table as text: a terminal's width and colours, or :data:`FILE_WIDTH` plain characters."""
    from rich.console import Console

    out = io.StringIO()
    width = shutil.get_terminal_size().columns if terminal else FILE_WIDTH
    Console(file=out, width=width, force_terminal=terminal, no_color=not terminal, highlight=False).print(table)
    return out.getvalue().rstrip("\n")


def _keys(samples: list[dict[str, Any]], prefix: str) -> list[str]:
    """The ``prefix`` columns any sample has, in first-seen order."""
    seen: dict[str, None] = {}
    for sample in samples:
        seen.update((key, None) for key, value in sample.items() if key.startswith(prefix) and value is not None)
    return list(seen)
