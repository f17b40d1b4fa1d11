"""A model's shapes from its ``config.json`` alone: the model is built on torch's ``meta`` device, so no weight is
read and no memory is taken (a 70B config builds in seconds on a laptop)."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

from rlhf.errors import ConfigError


@dataclass(frozen=True)
class ModelShape:
    """What a memory plan needs of one model, counted from its modules (not from the config's claims)."""

    path: str
    parameters: int  #: every parameter (tied embeddings counted once)
    largest_layer: int  #: parameters of the largest decoder layer or embedding: what ZeRO-3 gathers at once
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    head_parameters: int  #: the LM head's own parameters (0 where it is tied to the embeddings)
    matrix_parameters: int  #: 2-D weights inside the decoder layers (what Muon updates; the rest takes Adam)
    #: LoRA's trainable parameters per rank, by target module name: Σ (in + out) of that name's linear layers
    lora_in_out: dict[str, int] = field(default_factory=dict)
    max_positions: int | None = None  #: the config's ``max_position_embeddings``: the run caps ``--data.max_len`` there

    def lora_parameters(self, rank: int, targets: str | list[str]) -> int:
        """Trainable parameters of LoRA at ``rank`` on ``targets`` ("all-linear", or module names)."""
        names = self.lora_in_out if targets in ("all-linear", ["all-linear"]) else [targets] if isinstance(targets, str) else targets
        return rank * sum(self.lora_in_out.get(name, 0) for name in names)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of one token in every layer."""
        return 2 * self.layers * self.kv_heads * self.head_dim * dtype_bytes

    def value_model(self) -> ModelShape:
        """The same trunk with a one-output value head instead of the LM head (critic, reward model)."""
        return ModelShape(**{**self.__dict__, "parameters": self.parameters - self.head_parameters + self.hidden,
                             "head_parameters": self.hidden, "vocab": 0})


def model_shape(path: str, flag: str) -> ModelShape:
    """The shape of the model in directory ``path`` (its config.json; weights are not needed) or a hub name whose
    config is cached; a :class:`ConfigError` naming ``flag`` otherwise."""
    return _shape(str(Path(path).expanduser()) if Path(path).expanduser().exists() else path, flag)


@functools.lru_cache(maxsize=16)
def _shape(path: str, flag: str) -> ModelShape:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{flag} {path}: no readable config.json ({str(exc).splitlines()[0]}); give a model "
                          "directory or a cached hub name") from None
    text = getattr(config, "text_config", None) or config
    with torch.device("meta"):
        try:
            model = AutoModelForCausalLM.from_config(config)
        except ValueError as exc:
            raise ConfigError(f"{flag} {path}: transformers cannot build this model type ({exc})") from None
    unique = {id(p): p for p in model.parameters()}
    layers = _decoder_layers(model)
    largest = max([sum(p.numel() for p in layer.parameters()) for layer in layers]
                  + [model.get_input_embeddings().weight.numel()])
    head = model.get_output_embeddings()
    embed = model.get_input_embeddings()
    head_parameters = 0 if head is None or head.weight is embed.weight else head.weight.numel()
    lora: dict[str, int] = {}
    for layer in layers:
        for name, module in layer.named_modules():
            if isinstance(module, torch.nn.Linear):
                key = name.rsplit(".", 1)[-1]
                lora[key] = lora.get(key, 0) + module.in_features + module.out_features
    heads = text.num_attention_heads
    return ModelShape(
        path=path, parameters=sum(p.numel() for p in unique.values()), largest_layer=largest, layers=len(layers),
        hidden=text.hidden_size, intermediate=getattr(text, "intermediate_size", 4 * text.hidden_size), heads=heads,
        kv_heads=getattr(text, "num_key_value_heads", None) or heads,
        head_dim=getattr(text, "head_dim", None) or text.hidden_size // heads, vocab=text.vocab_size,
        head_parameters=head_parameters,
        matrix_parameters=sum(p.numel() for layer in layers for p in layer.parameters() if p.ndim == 2),
        lora_in_out=lora, max_positions=getattr(text, "max_position_embeddings", None))


def _decoder_layers(model: object) -> list:
    """The repeated blocks: the longest ``ModuleList`` of the model."""
    import torch

    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []
