"""`rlhf --help` and `rlhf plugins` stay light: no torch (or other engine) import."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = ("torch", "ray", "deepspeed", "vllm", "transformers")


@pytest.mark.parametrize("argv", [["--help"], ["plugins"], ["plugins", "--json"], ["train"],
                                  ["config", "convert", "--trainer", "ppo", "--", "--pretrain", "m", "--bf16"]])
def test_light_commands_do_not_import_engines(argv: list[str]) -> None:
    code = (
        "import sys\n"
        "from rlhf.cli.main import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit:\n"
        "    pass\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "[]"
