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
    #: each decoder layer's attention where the config says (``layer_types``): ``full_attention`` (empty: all are),
    #: ``sliding_attention`` (K and V of the last ``sliding_window`` tokens), ``linear_attention`` (a fixed state)
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None
    #: elements of one linear-attention layer's state per sequence (its recurrent state and convolution window)
    linear_state_elements: int = 0

    def lora_parameters(self, rank: int, targets: str | list[str]) -> int:
        """Trainable parameters of LoRA at ``rank`` on ``targets`` ("all-linear", or module names)."""
        names = self.lora_in_out if targets in ("all-linear", ["all-linear"]) else [targets] if isinstance(targets, str) else targets
        return rank * sum(self.lora_in_out.get(name, 0) for name in names)

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """K and V of one token in every layer that keeps them (full and sliding-window attention; a linear-attention
        layer keeps a state instead)."""
        kept = sum(kind != "linear_attention" for kind in self.layer_types) if self.layer_types else self.layers
        return 2 * kept * self.kv_heads * self.head_dim * dtype_bytes

    def kv_cache_bytes(self, dtype_bytes: int, sequences: int, length: int) -> int:
        """What ``sequences`` sequences of ``length`` tokens hold while they are generated: K and V of every token in
        a full-attention layer, of the last ``sliding_window`` tokens in a sliding-window layer, and one fixed state
        per sequence in a linear-attention layer (Gated DeltaNet's recurrent state and convolution window)."""
        per_layer = 2 * self.kv_heads * self.head_dim * dtype_bytes
        kinds = self.layer_types or ("full_attention",) * self.layers
        window = min(length, self.sliding_window or length)
        per_sequence = sum(per_layer * length if kind == "full_attention" else per_layer * window
                           if kind == "sliding_attention" else self.linear_state_elements * dtype_bytes for kind in kinds)
        return sequences * per_sequence

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
        lora_in_out=lora, max_positions=getattr(text, "max_position_embeddings", None),
        layer_types=tuple(getattr(text, "layer_types", None) or ()), sliding_window=getattr(text, "sliding_window", None),
        linear_state_elements=_linear_state_elements(text))


def _linear_state_elements(text: object) -> int:
    """Elements of one Gated DeltaNet layer's state per sequence (Qwen3.5, Qwen3-Next): a ``key x value`` matrix per
    value head, and the short convolution's window over the q, k and v projections; 0 for a model without one."""
    value_heads = getattr(text, "linear_num_value_heads", 0) or 0
    if not value_heads:
        return 0
    key_dim, value_dim = text.linear_key_head_dim, text.linear_value_head_dim
    conv_channels = 2 * text.linear_num_key_heads * key_dim + value_heads * value_dim
    return value_heads * key_dim * value_dim + conv_channels * getattr(text, "linear_conv_kernel_dim", 4)


def _decoder_layers(model: object) -> list:
    """The repeated blocks: the longest ``ModuleList`` of the model."""
    import torch

    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []
