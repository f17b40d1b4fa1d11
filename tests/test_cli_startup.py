"""`rlhf --help` and `rlhf plugins` stay light: no torch (or other engine) import."""

from __future__ import annotations

import os
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


def test_the_transport_is_chosen_before_ray_without_importing_torch() -> None:
    """Ray starts once the controller's checks before it are done, and torch imports while Ray starts: choosing
    the weight-sync transport on the way must not import it (about 2.7 s here, all of it on start-up's critical
    path). A choice that needs CUDA still asks torch before Ray starts (tests/test_user_errors.py)."""
    code = (
        "import sys\n"
        "from rlhf.config.ppo import PPOConfig\n"
        "from rlhf.host.plugin_host import PluginHost\n"
        "from rlhf.runtime.sync.weights import transport_before_ray\n"
        "config = PPOConfig()\n"
        "config.vllm.num_engines = 1\n"
        "print(transport_before_ray(config, PluginHost.load().registry), 'torch' in sys.modules)\n"
    )
    env = {key: value for key, value in os.environ.items() if key != "RAY_ADDRESS"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["gloo", "False"]
