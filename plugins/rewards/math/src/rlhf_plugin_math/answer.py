"""Answer extraction and math-verify equivalence (see the package docstring)."""

from __future__ import annotations

import re
from typing import Any

NUMBER = re.compile(r"-?\d+(?:\.\d+)?(?:\s*/\s*\d+)?")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` with balanced braces, or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i:j]
    return None


def extract_answer(response: str) -> str | None:
    boxed = last_boxed(response)
    if boxed is not None:
        return boxed.strip()
    numbers = NUMBER.findall(response)
    return numbers[-1].replace(" ", "") if numbers else None


def equivalent(answer: str, label: str) -> bool:
    import threading

    from math_verify import parse, verify

    # math-verify's own timeouts use signal.alarm, which only works in the main thread
    # (a reward server answers from worker threads): there, run without them
    timeout: int | None = 5 if threading.current_thread() is threading.main_thread() else None
    gold = parse(f"${label}$", parsing_timeout=timeout)
    guess = parse(f"${answer}$", parsing_timeout=timeout)
    return bool(gold) and bool(guess) and bool(verify(gold, guess, timeout_seconds=timeout))


class MathAnswer:
    per_sample = True
    needs_labels = True  # the reference answer; the core refuses a run without --data.label_key

    def __call__(self, query: str, prompt: str, label: Any, **columns: Any) -> float:
        answer = extract_answer(query[len(prompt):])
        return float(answer is not None and equivalent(answer, str(label)))
