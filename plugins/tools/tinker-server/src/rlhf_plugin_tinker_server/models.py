"""One loaded base model shared by every tenant: each training run and each sampler snapshot is a LoRA adapter of
its own on the same PEFT-wrapped module, switched in before each computation.

Only the server's one worker thread calls into a :class:`ServedModel` (see :mod:`.service`): switching adapters
on a shared module is not safe across threads, and one computation at a time is what makes a tenant's results
independent of the others'.
"""

from __future__ import annotations

import contextlib
import warnings
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class LoraShape:
    """What a tenant's adapter is: the SDK's ``LoraConfig`` less its seed."""

    rank: int
    train_attn: bool = True
    train_mlp: bool = True
    train_unembed: bool = True


@dataclass
class ServedModel:
    """A base model as the server serves it: the name clients use, where it was loaded from, the HF module, its
    tokenizer, device and context length, and the PEFT wrapper that holds the adapters (from the first one on)."""

    name: str
    path: str
    module: Any
    tokenizer: Any
    device: Any
    max_context_length: int
    #: the base model's linear layers by name, each ``attn``, ``mlp`` or ``unembed`` (what LoRA may target), read
    #: before any adapter wraps them
    linear_layers: dict[str, str] = field(default_factory=dict)
    adapters: dict[str, LoraShape] = field(default_factory=dict)
    peft: Any = None

    @property
    def arch(self) -> str:
        return type(self.module).__name__

    def add_adapter(self, name: str, shape: LoraShape, seed: int) -> None:
        """A new LoRA adapter ``name``, initialised from ``seed`` alone (the process's random state is left as it
        was, so one tenant's creation never shifts another's numbers)."""
        import torch
        from peft import LoraConfig, get_peft_model

        wanted = {"attn": shape.train_attn, "mlp": shape.train_mlp, "unembed": shape.train_unembed}
        targets = [name for name, kind in self.linear_layers.items() if wanted[kind]]
        if not targets:
            raise ValueError(
                f"the base model {self.name} has no linear layers for train_attn={shape.train_attn}, "
                f"train_mlp={shape.train_mlp}, train_unembed={shape.train_unembed}"
            )
        config = LoraConfig(r=shape.rank, lora_alpha=32, lora_dropout=0.0, target_modules=targets, bias="none")
        devices = [self.device] if self.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), warnings.catch_warnings():
            # A LoRA on a tied lm_head adapts the output projection only and leaves the shared embedding frozen,
            # which is what a tenant's adapter should do; PEFT's warning is about merging, which never happens here
            warnings.filterwarnings("ignore", message=".*tie_word_embeddings.*")
            torch.manual_seed(seed)
            if self.peft is None:
                self.peft = get_peft_model(self.module, config, adapter_name=name)
            else:
                self.peft.add_adapter(name, config)
        self.adapters[name] = shape
        self.peft.eval()  # no dropout anywhere: a datum's numbers depend on the weights only

    def adapter_parameters(self, name: str) -> dict[str, Any]:
        """The adapter's parameters by their name in the HF module."""
        return {key: param for key, param in self.module.named_parameters() if f".{name}." in key}

    def copy_adapter(self, source: str, target: str) -> None:
        """``target`` holds ``source``'s weights from now on (a snapshot: later training of ``source`` leaves it)."""
        import torch

        targets = self.adapter_parameters(target)
        with torch.no_grad():
            for key, param in self.adapter_parameters(source).items():
                targets[key.replace(f".{source}.", f".{target}.")].copy_(param)

    def delete_adapter(self, name: str) -> None:
        with warnings.catch_warnings():  # the active adapter is set before every computation, never inherited
            warnings.filterwarnings("ignore", message=".*was active which is now deleted.*")
            self.peft.delete_adapter(name)
        del self.adapters[name]

    @contextlib.contextmanager
    def using(self, adapter: str | None):
        """Compute with ``adapter`` (None: the base model alone); only its parameters take gradients."""
        if adapter is not None:
            self.peft.set_adapter(adapter)
            yield self.peft
        elif self.adapters:
            with self.peft.disable_adapter():
                yield self.peft
        else:  # no adapter left (or none yet): PEFT's layers, if any, hold nothing, and its wrapper needs an adapter
            yield self.module

    def target_logprobs(self, adapter: str | None, inputs: list[list[int]], targets: list[Any]) -> list[Any]:
        """Each sequence's log-probs of its targets, ``(T_i,)`` fp32: position ``t`` reads the distribution after
        ``inputs[i][:t+1]`` at ``targets[i][t]``. One right-padded forward; differentiable when grad is enabled."""
        import torch

        from rlhf.ops import chunked_logprobs

        longest = max(len(tokens) for tokens in inputs)
        ids = torch.zeros(len(inputs), longest, dtype=torch.long)
        wanted = torch.zeros(len(inputs), longest, dtype=torch.long)
        mask = torch.zeros(len(inputs), longest, dtype=torch.long)
        for row, (tokens, target) in enumerate(zip(inputs, targets)):
            ids[row, : len(tokens)] = torch.as_tensor(tokens)
            wanted[row, : len(tokens)] = torch.as_tensor(target)
            mask[row, : len(tokens)] = 1
        ids, wanted, mask = ids.to(self.device), wanted.to(self.device), mask.to(self.device)
        with self.using(adapter) as module:
            logits = module(input_ids=ids, attention_mask=mask).logits
        rows = torch.arange(len(inputs), device=self.device)[:, None]
        positions = torch.arange(longest, device=self.device)[None]
        logprobs, _ = chunked_logprobs(logits, rows, positions, wanted, mask=mask)
        return [logprobs[row, : len(tokens)] for row, tokens in enumerate(inputs)]


def linear_layer_kinds(module: Any) -> dict[str, str]:
    """The linear layers the SDK's LoRA flags name: attention projections, MLP projections, the unembedding."""
    import torch

    kinds = {}
    for name, layer in module.named_modules():
        if not isinstance(layer, torch.nn.Linear):
            continue
        if any(part in name for part in (".self_attn.", ".attn.", ".attention.")):
            kinds[name] = "attn"
        elif any(part in name for part in (".mlp.", ".feed_forward.", ".ffn.")):
            kinds[name] = "mlp"
        elif name.rsplit(".", 1)[-1] == "lm_head":
            kinds[name] = "unembed"
    return kinds


def load_served_model(name: str, path: str, dtype: str) -> ServedModel:
    """The model directory ``path`` loaded as rlhf's trainers load a causal LM, on this process's device."""
    from rlhf.devices import local_device
    from rlhf.models.loading import check_model_source, load_causal_lm, load_tokenizer, torch_dtype

    config = check_model_source(path, "--model")
    tokenizer = load_tokenizer(path, "--model")
    device = local_device()
    module = load_causal_lm(path, torch_dtype(dtype), "sdpa").to(device).eval()
    for param in module.parameters():
        param.requires_grad_(False)  # the base is shared and frozen: only adapters train
    context = getattr(config, "max_position_embeddings", None) or getattr(tokenizer, "model_max_length", 2048)
    return ServedModel(
        name=name,
        path=path,
        module=module,
        tokenizer=tokenizer,
        device=device,
        max_context_length=int(context),
        linear_layers=linear_layer_kinds(module),
    )
