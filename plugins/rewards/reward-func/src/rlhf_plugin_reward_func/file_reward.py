"""Load ``reward_func`` from a Python file and call it with OpenRLHF's arguments."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any


class RewardFuncFile:
    def __init__(self, path: str) -> None:
        file = Path(path).expanduser().resolve()
        if not file.is_file():
            raise FileNotFoundError(f"--reward.remote_url {path}: reward file not found")
        spec = importlib.util.spec_from_file_location(f"rlhf_reward_file_{file.stem}", file)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        function = getattr(module, "reward_func", None)
        if not callable(function):
            raise AttributeError(f"--reward.remote_url {path}: the file defines no reward_func(queries, prompts, labels, **kwargs)")
        self.path, self.function = str(file), function

    @classmethod
    def from_config(cls, config: Any) -> RewardFuncFile:
        return cls(config.reward.remote_url)

    def __call__(self, queries: list[str], prompts: list[str], labels: list[Any], **kwargs: Any) -> Any:
        """The file's own result; the core normalises it (see :mod:`rlhf.reward_output`)."""
        return self.function(queries, prompts, labels, **kwargs)
