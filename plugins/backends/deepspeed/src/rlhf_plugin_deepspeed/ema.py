"""``--train.enable_ema``: an exponential moving average of a trained model's weights (OpenRLHF's EMA).

After every optimizer step, ``ema ← β·ema + (1 − β)·θ`` for each trainable parameter θ
(β = ``--train.ema_beta``); frozen parameters are the model's own. The average is what the
run's HF model saves hold (as OpenRLHF saves its EMA model instead of the actor); weight
sync and training use the live weights.

Under ZeRO-3 every rank averages only its own shard of each parameter (``param.ds_tensor``):
the average is elementwise, so the shards of the average are the average of the shards and
no step gathers anything. The shadow lives on the CPU in fp32 (on GPUs this is OpenRLHF's
offloaded EMA copy). A save swaps the shadow into the parameters' storage, gathers as usual,
and swaps the live weights back.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from rlhf.errors import CheckpointError


def _local(param: Any) -> Any:
    """The part of ``param`` this rank holds: its ZeRO-3 shard, or the whole tensor."""
    return param.ds_tensor if hasattr(param, "ds_tensor") else param.data


class ParameterEMA:
    """The EMA of ``module``'s trainable parameters (the module of a DeepSpeed engine, any ZeRO stage)."""

    def __init__(self, module: Any, beta: float) -> None:
        if not 0.0 <= beta < 1.0:
            from rlhf.errors import ConfigError

            raise ConfigError(f"--train.ema_beta must be in [0, 1) (got {beta})")
        self.beta = beta
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.shadow = [self._copy(p) for p in self.params]

    @staticmethod
    def _copy(param: Any) -> Any:
        import torch

        return _local(param).detach().to("cpu", torch.float32, copy=True)

    def update(self) -> None:
        """Fold the current weights in; call once after every optimizer step, on every rank."""
        import torch

        with torch.no_grad():
            for param, shadow in zip(self.params, self.shadow):
                shadow.mul_(self.beta).add_(_local(param).detach().to("cpu", torch.float32), alpha=1.0 - self.beta)

    @contextlib.contextmanager
    def applied(self):
        """The module holds the average inside the block (every rank must enter it: saves gather)."""
        import torch

        live = [self._copy(p) for p in self.params]
        with torch.no_grad():
            for param, shadow in zip(self.params, self.shadow):
                _local(param).copy_(shadow)
        try:
            yield
        finally:
            with torch.no_grad():
                for param, weights in zip(self.params, live):
                    _local(param).copy_(weights)

    def save(self, directory: Path, rank: int, world_size: int) -> None:
        """This rank's shadow into ``directory/ema_rank<rank>.pt`` (a checkpoint's share)."""
        import torch

        directory.mkdir(parents=True, exist_ok=True)
        torch.save({"beta": self.beta, "world_size": world_size, "shadow": self.shadow}, directory / f"ema_rank{rank}.pt")

    def load(self, directory: Path, rank: int, world_size: int) -> None:
        import torch

        path = directory / f"ema_rank{rank}.pt"
        if not path.is_file():
            raise CheckpointError(f"checkpoint {directory.parent} has no EMA state {path.name} (saved without "
                                  "--train.enable_ema?); resume without --train.enable_ema, or from a checkpoint with it")
        state = torch.load(path, map_location="cpu")
        if state["world_size"] != world_size or len(state["shadow"]) != len(self.shadow):
            raise CheckpointError(f"{path}: the EMA was saved by {state['world_size']} rank(s) and this run has "
                                  f"{world_size}; resume the EMA on the same number of actor ranks")
        self.shadow = state["shadow"]
