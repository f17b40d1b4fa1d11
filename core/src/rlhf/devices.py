"""Which device this process computes on. Public: training backends and rollout engines use it
(docs/plugin-api.md).

Ray gives each GPU actor its own device as ``cuda:0`` (``CUDA_VISIBLE_DEVICES`` holds one id), and a
launcher (``torchrun``, ``deepspeed``) sets ``LOCAL_RANK`` for processes that see every device of the
node; either way ``cuda:LOCAL_RANK`` is this process's. Nothing here asks how many GPUs a run has: that is
read from Ray's cluster resources when the run is placed.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["local_device"]


def local_device() -> Any:
    """This process's ``torch.device``: ``cuda:LOCAL_RANK`` (0 when unset) where CUDA is available, else the CPU."""
    import torch

    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return torch.device("cpu")
