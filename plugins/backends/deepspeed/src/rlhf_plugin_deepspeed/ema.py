"""``--train.enable_ema``: an exponential moving average of a trained model's weights (OpenRLHF's EMA).

After every optimizer step, ``ema ← β·ema + (1 − β)·θ`` for each trainable parameter θ
(β = ``--train.ema_beta``); frozen parameters are the model's own. The average is what the
run's HF model saves hold (as OpenRLHF saves its EMA model instead of the actor); weight
sync and training use the live weights.

Under ZeRO-3 every rank averages only its own shard of each parameter (``param.ds_tensor``):
the average is elementwise, so the shards of the average are the average of the shards and
no step gathers anything. The shadow lives on the CPU in fp32 (on GPUs this is OpenRLHF's
offloaded EMA copy). A save swaps the shadow into the parameters' storage, gathers as usual,
and swaps the live weights back. A checkpoint holds each rank's shadow; a resume on another number
of ranks (or ZeRO stage) rebuilds each whole parameter from the saved pieces and keeps its own part.
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
        """What :meth:`save` wrote, on any number of ranks: as many as saved it load their own files; another
        number rebuilds each whole parameter from every saved shard and keeps its part of it."""
        import torch

        first = directory / "ema_rank0.pt"
        if not first.is_file():
            raise CheckpointError(f"checkpoint {directory.parent} has no EMA state {first.name} (saved without "
                                  "--train.enable_ema?); resume without --train.enable_ema, or from a checkpoint with it")
        state = torch.load(first, map_location="cpu")
        if len(state["shadow"]) != len(self.shadow):
            raise CheckpointError(f"{first}: the EMA holds {len(state['shadow'])} trainable tensors and this model has "
                                  f"{len(self.shadow)}; resume with the model (and --ds.lora.* flags) it was written with")
        if state["world_size"] == world_size:
            self.shadow = torch.load(directory / f"ema_rank{rank}.pt", map_location="cpu")["shadow"] if rank else state["shadow"]
            return
        saved = [state] + [torch.load(directory / f"ema_rank{r}.pt", map_location="cpu")
                           for r in range(1, state["world_size"])]
        self.shadow = [resharded([s["shadow"][i] for s in saved], param, rank)
                       for i, param in enumerate(self.params)]


def _numel(param: Any) -> int:
    return int(getattr(param, "ds_numel", param.numel()))


def resharded(pieces: list[Any], param: Any, rank: int) -> Any:
    """This rank's part of one parameter's EMA (fp32, on the CPU) from the ``pieces`` each saving rank held:
    ZeRO-3 shards (flat, padded alike) or whole copies. The part is ``param``'s ZeRO-3 shard (flat, padded to
    its size) or the whole tensor."""
    import torch

    shape, numel = tuple(getattr(param, "ds_shape", param.shape)), _numel(param)
    if tuple(pieces[0].shape) == shape:  # a whole copy on every saving rank (ZeRO 0-2, or one rank)
        whole = pieces[0].reshape(-1)
    else:
        whole = torch.cat([piece.reshape(-1) for piece in pieces])[:numel]
    if not hasattr(param, "ds_tensor"):
        return whole.reshape(shape).clone()
    size = param.ds_tensor.numel()
    mine = whole[rank * size:(rank + 1) * size]
    return torch.nn.functional.pad(mine, (0, size - mine.numel())).reshape(param.ds_tensor.shape).clone()
