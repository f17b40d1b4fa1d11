"""The Liger model extension (contract: :mod:`rlhf.models.extensions`)."""

from __future__ import annotations

from typing import Any

from rlhf.errors import ConfigError

FLAG = "--ds.use_liger_kernel"


class Liger:
    def prepare(self, role: str, config: Any) -> None:
        """In the worker, before loading: Liger's kernels are Triton, so they need a CUDA GPU and liger-kernel."""
        import importlib.util

        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"{FLAG}: Liger's kernels are Triton GPU kernels and this machine has no CUDA GPU "
                              f"(the {role} worker found none); drop {FLAG} on CPU machines")
        if importlib.util.find_spec("liger_kernel") is None:
            raise ConfigError(f"{FLAG} needs the liger-kernel package: pip install 'rlhf-plugin-liger[gpu]'")

    def wrap(self, model: Any, role: str, config: Any) -> Any:
        """Patch the loaded instance (a peft model is patched through its base model)."""
        from liger_kernel.transformers import _apply_liger_kernel_to_instance

        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        _apply_liger_kernel_to_instance(model=base)
        return model
