"""The ring-attention model extension (contract: :mod:`rlhf.models.extensions`)."""

from __future__ import annotations

import importlib.util
from typing import Any

from rlhf.errors import ConfigError


class RingAttention:
    group: Any = None

    def prepare(self, role: str, config: Any) -> None:
        """In the worker, after the process group exists: check the machine, form the ring groups
        (every rank creates every group: ``new_group`` is collective) and route HF flash attention
        through ring-flash-attn."""
        import torch
        import torch.distributed as dist

        size, stride = config.ds.ring_attn_size, config.ds.ring_attn_head_stride
        flag = f"--ds.ring_attn_size {size}"
        if size == 1:
            return
        if not torch.cuda.is_available():
            raise ConfigError(f"{flag}: ring attention runs flash-attn's varlen kernel across GPUs and this machine has "
                              f"no CUDA GPU (the {role} worker found none); use --ds.ring_attn_size 1 on CPU machines")
        missing = [name for name in ("flash_attn", "ring_flash_attn") if importlib.util.find_spec(name) is None]
        if missing:
            raise ConfigError(f"{flag} needs {' and '.join(missing)}: pip install 'rlhf-plugin-ring-attn[gpu]'")
        world, rank = dist.get_world_size(), dist.get_rank()
        if world % size:
            raise ConfigError(f"{flag} must divide the {role} group's {world} ranks (--{role}.num_nodes x "
                              f"--{role}.num_gpus_per_node)")
        for start in range(0, world, size):
            group = dist.new_group(list(range(start, start + size)))
            if start <= rank < start + size:
                self.group = group
        from ring_flash_attn import substitute_hf_flash_attn

        substitute_hf_flash_attn(self.group, heads_k_stride=stride)

    def wrap(self, model: Any, role: str, config: Any) -> Any:
        """Route the backbone's forward (shared by the LM head and the value head) through the ring;
        an instance attribute, so parameter names and the state dict are unchanged."""
        if self.group is None:
            return model
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        backbone = getattr(base, base.base_model_prefix)
        backbone.forward = RingForward(backbone.forward, self.group)
        return model


class RingForward:
    """``backbone.forward`` for one packed row per rank: the ring group's rows joined, one slice each."""

    def __init__(self, forward: Any, group: Any) -> None:
        self.forward, self.group = forward, group

    def __call__(self, input_ids: Any = None, position_ids: Any = None, attention_mask: Any = None, **kwargs: Any) -> Any:
        import torch
        import torch.distributed as dist
        import torch.distributed.nn.functional as dist_nn
        from ring_flash_attn import update_ring_flash_attn_params

        if position_ids is None or attention_mask is not None or input_ids.shape[0] != 1:
            raise ValueError("ring attention runs on packed rows: --ds.packing_samples with flash_attention_2")
        size, me = dist.get_world_size(self.group), dist.get_rank(self.group)
        length = torch.tensor([input_ids.shape[1]], device=input_ids.device)
        lengths = [torch.zeros_like(length) for _ in range(size)]
        dist.all_gather(lengths, length, group=self.group)
        lengths = [int(n) for n in lengths]
        widest = max(lengths)

        def gather_rows(row: Any) -> Any:
            padded = torch.nn.functional.pad(row, (0, widest - row.shape[1]))
            parts = [torch.empty_like(padded) for _ in range(size)]
            dist.all_gather(parts, padded, group=self.group)
            return torch.cat([part[:, :n] for part, n in zip(parts, lengths)], dim=1)

        ids, positions = gather_rows(input_ids), gather_rows(position_ids)
        total = ids.shape[1]
        tail = -total % size  # a filler sequence so every rank gets an equal slice
        ids = torch.nn.functional.pad(ids, (0, tail))
        positions = torch.cat([positions, torch.arange(tail, device=positions.device)[None]], dim=1)
        starts = torch.nonzero(positions[0] == 0).flatten()
        cu_seqlens = torch.cat([starts, torch.tensor([total + tail], device=starts.device)]).to(torch.int32)
        update_ring_flash_attn_params(cu_seqlens, self.group)
        chunk = (total + tail) // size
        mine = slice(me * chunk, (me + 1) * chunk)
        output = self.forward(input_ids=ids[:, mine], position_ids=positions[:, mine], **kwargs)
        hidden = torch.cat(dist_nn.all_gather(output.last_hidden_state.contiguous(), group=self.group), dim=1)
        offset = sum(lengths[:me])
        output.last_hidden_state = hidden[:, offset : offset + lengths[me]]
        return output
