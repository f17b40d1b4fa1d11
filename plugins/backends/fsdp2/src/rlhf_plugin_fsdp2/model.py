"""An FSDP2-sharded HF model as a :class:`rlhf.components.TrainedModel` (and, without optimizer, as an
evaluated-only forward).

The module's parameters are ``DTensor`` shards outside a forward. Gradient accumulation relies on FSDP2
reduce-scattering (averaging over the ranks) at every backward and adding into the sharded ``.grad``:
each rank holds only its shard of the gradients, at the price of one reduce-scatter per micro-batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from rlhf.errors import CheckpointError


class EvaluatedModel:
    """A sharded model for no-grad forwards: callable, with ``module``, ``device``, ``train()`` and ``eval()``."""

    def __init__(self, module: Any, device: torch.device) -> None:
        self.module, self.device = module, device

    def __call__(self, **inputs: Any) -> Any:
        return self.module(**inputs)

    def train(self) -> None:
        self.module.train()

    def eval(self) -> None:
        self.module.eval()


class FSDP2Model(EvaluatedModel):
    """A ``fully_shard``-ed module with its optimizer and LR scheduler, stepping every
    ``accumulation`` micro-batches (or where :meth:`backward` says) with clipping at ``max_norm`` (0: none)."""

    sharded = True  # every forward all-gathers each unit's shards: collective over the ranks

    def __init__(self, module: Any, device: torch.device, optimizer: Any, lr_scheduler: Any, accumulation: int,
                 max_norm: float) -> None:
        super().__init__(module, device)
        self.optimizer, self.lr_scheduler = optimizer, lr_scheduler
        self._accumulation, self._max_norm = accumulation, max_norm
        self._micro_steps = 0  # backward calls in fixed mode; a checkpoint keeps it so the boundaries stay put
        self._at_boundary = False

    def accumulation_steps(self) -> int:
        return self._accumulation

    def backward(self, loss: Any, boundary: bool | None = None) -> None:
        if boundary is None:
            self._micro_steps += 1
            self._at_boundary = self._micro_steps % self._accumulation == 0
            loss = loss / self._accumulation
        else:
            self._at_boundary = boundary
        loss.backward()  # FSDP2 reduce-scatters the gradient (the mean over the ranks) into the sharded .grad

    def step(self) -> bool:
        if not self._at_boundary:
            return False
        self._at_boundary = False
        if self._max_norm > 0:  # the norm of DTensor gradients is global: clip_grad_norm_ all-reduces it
            params = [p for group in self.optimizer.param_groups for p in group["params"]]
            torch.nn.utils.clip_grad_norm_(params, self._max_norm)
        self.optimizer.step()
        self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return True

    def learning_rate(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def state_dict(self, copy: bool = True) -> dict[str, Any] | None:
        """The gathered fp32 weights on rank 0, None elsewhere. On one CPU rank gathering and offloading move nothing
        (a one-rank DTensor's whole tensor is its shard), so the entries would be the live weights, which the next
        step changes: with ``copy`` those are cloned."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(self.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if dist.get_rank() != 0:
            return None
        if copy:
            live = {_storage(tensor) for tensor in self.module.state_dict().values()}
            state = {name: tensor.clone() if _storage(tensor) in live else tensor for name, tensor in state.items()}
        return state

    @contextlib.contextmanager
    def gathered(self) -> Iterator[None]:
        """Every FSDP unit unsharded: ``module``'s parameters (read through ``named_parameters()`` or the
        submodules, not ``state_dict()``, whose FSDP2 hook reshards) are whole, in the compute dtype, inside.
        ``unshard()`` is not recursive, hence one call per unit."""
        from torch.distributed.fsdp import FSDPModule

        units = [m for m in self.module.modules() if isinstance(m, FSDPModule)]
        for unit in units:
            unit.unshard()
        try:
            yield
        finally:
            for unit in units:
                unit.reshard()

    @contextlib.contextmanager
    def full_tensors(self, names: list[str]) -> Iterator[list[Any]]:
        """Each named entry all-gathered on its own (a bucket at a time, as a weight sync reads them), fp32, on this
        rank's device (an offloaded shard is copied there first, so the gather and the transport stay on the GPU)."""
        live = self.module.state_dict(keep_vars=True)
        yield [_whole(live[name].to(self.device)) for name in names]

    def full_shape(self, tensor: Any) -> tuple[int, ...]:
        return tuple(tensor.shape)  # a DTensor's shape is the global one

    def save_checkpoint(self, directory: str, tag: str) -> None:
        from rlhf_plugin_fsdp2.checkpoint import save_states

        extra = {"lr_scheduler": self.lr_scheduler.state_dict(), "micro_steps": self._micro_steps,
                 "accumulation": self._accumulation}
        save_states(self.module, self.optimizer, extra, Path(directory), tag)

    def load_checkpoint(self, directory: str, tag: str) -> None:
        from rlhf_plugin_fsdp2.checkpoint import load_states

        extra = load_states(self.module, self.optimizer, Path(directory), tag)
        self.lr_scheduler.load_state_dict(extra["lr_scheduler"])
        # where in an optimizer step it was saved (a trainer saves between steps: 0); another number of ranks
        # accumulates over another number of micro-batches, so only that position carries over
        saved = extra.get("accumulation", self._accumulation)
        if extra["micro_steps"] % saved and saved != self._accumulation:
            raise CheckpointError(f"checkpoint {Path(directory) / tag} was saved inside an optimizer step of {saved} "
                                  f"micro-batches and this run takes {self._accumulation}: resume it on as many ranks "
                                  "as wrote it")
        self._micro_steps = extra["micro_steps"] % saved

    def awake(self, phase: str) -> Any:
        """No sleep mode: the optimizer states always stay where they were built."""
        return contextlib.nullcontext()

    def sleep_history(self) -> list[tuple[str, float]]:
        return []


def _whole(tensor: Any) -> Any:
    """The unsharded value of a state-dict entry (a plain buffer is whole already)."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def _storage(tensor: Any) -> int:
    """Where a state-dict entry's values live (a DTensor's: its local shard's)."""
    local = tensor.to_local() if isinstance(tensor, DTensor) else tensor
    return local.untyped_storage().data_ptr()
