"""``--fsdp2.*``: the FSDP2 backend's own options (``plugins: {fsdp2: …}`` in YAML)."""

from __future__ import annotations

from typing import Any

from rlhf.config.base import Section, flag


class FSDP2Options(Section):
    cpu_offload: bool = flag(False, (
        "Keep the trained models' fp32 weights, gradients and optimizer states on the CPU (torch's CPUOffloadPolicy): "
        "each block is copied to the GPU for its all-gather and the optimizer steps on the CPU. On a machine without "
        "a GPU they are there already."), switch=True)


def fsdp2_options(config: Any) -> FSDP2Options:
    """The run's ``--fsdp2.*`` options (defaults where the config has no ``plugins`` block)."""
    return FSDP2Options.model_validate((getattr(config, "plugins", None) or {}).get("fsdp2", {}))
