"""Meta-tests that keep the hook contract honest: documented, in docs/hooks.md, and tested."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from gen_hook_docs import hook_names  # noqa: E402

from rlhf import hookspecs  # noqa: E402

HOOKS = hook_names()


def test_there_are_hooks_of_every_family() -> None:
    assert len([h for h in HOOKS if h.startswith("rlhf_register_")]) == 22
    assert {"rlhf_train_start", "rlhf_train_end", "rlhf_step_end", "rlhf_worker_init",
            "rlhf_checkpoint_save", "rlhf_checkpoint_load"} <= set(HOOKS)


@pytest.mark.parametrize("hook", HOOKS)
def test_hook_is_documented(hook: str) -> None:
    doc = getattr(hookspecs, hook).__doc__ or ""
    for heading in ("When:", "Process:", "How often:", "Shapes:"):
        assert heading in doc, f"{hook} docstring lacks {heading!r}"


def test_docs_hooks_md_is_generated_from_the_specs() -> None:
    result = subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_hook_docs.py"), "--check"],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_every_hook_has_a_test() -> None:
    tested = set()
    for path in (ROOT / "tests").rglob("test_*.py"):
        tested.update(re.findall(r"def (test_hook_rlhf_\w+)\(", path.read_text()))
    missing = [h for h in HOOKS if f"test_hook_{h}" not in tested]
    assert not missing, f"hooks without a test_hook_<name> test: {missing}"
