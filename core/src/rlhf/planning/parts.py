"""The pieces of a memory plan a component answers with, and the standard formulas components build them from.

A training backend's optional classmethod ``plan_memory(config, model)`` gets a :class:`PlannedModel` and returns
the :class:`MemoryPart` s one GPU of that model holds (weights, gradients, optimizer states, gather buffers); a
rollout engine's ``plan_memory(config, shape, gpu_memory)`` those of one GPU of one engine. The core adds the
activations (:func:`activation_bytes`), places the parts and sums them; it never guesses what a component did not
say (a component without the method is shown as "not estimated"). docs/plan.md has the formulas and their sources.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlhf.planning.shapes import ModelShape

#: The two phases of a step whose memory can differ: engines generate, then the models compute and train.
#: A part that sleep mode moves off the GPU lists the phase it is away in.
PHASES = ("generate", "train")
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


@dataclass(frozen=True)
class MemoryPart:
    """``nbytes`` of one GPU taken by one part of one model or engine; None: its component did not estimate it."""

    part: str  #: "weights", "gradients", "optimizer states", "activations", "KV cache", …
    nbytes: int | None
    note: str = ""  #: how it was counted, in a few words ("bf16, 1/8 of 7.6e9 (ZeRO-3)")
    away_in: tuple[str, ...] = ()  #: phases in which sleep mode has moved it off the GPU


@dataclass(frozen=True)
class PlannedModel:
    """One model group of a run, as a training backend's ``plan_memory`` sees it."""

    role: str  #: "actor", "critic", "ref", "reward", "model" (a supervised trainer's), …
    shape: ModelShape
    trained: bool  #: with gradients and an optimizer (else inference only)
    ranks: int  #: data-parallel ranks the group's states are split over
    trainable: int  #: parameters the optimizer updates (all, or LoRA's)
    optimizer_state_bytes: int | None  #: the optimizer's own states for ``trainable`` (Adam 8/param), fp32
    offload: bool = False  #: inference only: weights kept off the GPU between forwards (``--ref.offload``)
    section: Any = None  #: the group's config section (``config.actor``…), for anything else a backend reads


def dtype_bytes(param_dtype: str) -> int:
    return DTYPE_BYTES[param_dtype]


def activation_bytes(shape: ModelShape, tokens: int, sequence: int, dtype_size: int, *, checkpointing: bool,
                     eager_attention: bool, logits: bool, fused_logits: bool = False, backward: bool = True) -> int:
    """Activations a training forward keeps for its backward, for ``tokens`` tokens in sequences of ``sequence``.

    Per token and decoder layer, what autograd saves in a Llama-style block (norms keep their input, each linear
    its input, SwiGLU its gate, up and product): ``d·(6h + 2·kv + 4·I)``, with ``d`` the dtype's bytes, ``h`` the
    hidden size, ``kv`` the K/V width and ``I`` the MLP's; eager attention adds its score and probability matrices,
    ``2·d·heads·sequence``. Gradient checkpointing keeps each layer's input (``d·h``) and one layer's whole set
    while it is recomputed (Korthikanti et al., 2022, "Reducing Activation Recomputation in Large Transformer
    Models", §4). ``logits``: the LM head's fp32 logits and their log-softmax add ``8·vocab`` per token, unless
    ``fused_logits`` (a fused linear cross-entropy keeps none); ``rlhf plan`` passes False and counts the logits
    and the log-prob chunk as parts of their own (docs/plan.md). A forward without ``backward`` (log-probs, values) keeps one
    layer's set at a time."""
    per_layer = dtype_size * (6 * shape.hidden + 2 * shape.kv_heads * shape.head_dim + 4 * shape.intermediate)
    if eager_attention:
        per_layer += 2 * dtype_size * shape.heads * sequence
    if not backward:
        stored = per_layer
    elif checkpointing:
        stored = shape.layers * dtype_size * shape.hidden + per_layer
    else:
        stored = shape.layers * per_layer
    head = 8 * shape.vocab if logits and not fused_logits else 0
    return tokens * (stored + head)


def zero_model_states(model: PlannedModel, weight_bytes: int, stage: int, offload_optimizer: bool,
                      gather_layers: bool = True) -> list[MemoryPart]:
    """ZeRO's model states on one GPU (Rajbhandari et al., 2020, "ZeRO", §3; DeepSpeed's
    ``estimate_zero2/3_model_states_mem_needs``): weights in their dtype (split over the ranks from stage 3);
    gradients in the weights' dtype (split at stage 2; at stage 3 they are reduced straight into the fp32 partitions,
    which DeepSpeed's estimate counts as the only ones); the optimizer's partition (split from stage 1): fp32
    master weights and fp32 gradients where the weights are 16-bit (8 bytes) plus the optimizer's own states.
    Stage 3 also gathers one layer at a time, 4 bytes per parameter of the largest (DeepSpeed's figure).
    Offloading the optimizer moves the gradients and the optimizer's partition to the CPU."""
    shape, ranks = model.shape, model.ranks
    weights_split = ranks if stage >= 3 else 1
    parts = [MemoryPart("weights", shape.parameters * weight_bytes // weights_split,
                        f"{weight_bytes} B x {shape.parameters:.3g}" + (f" / {ranks} ranks" if weights_split > 1 else ""))]
    if stage >= 3 and gather_layers:
        parts.append(MemoryPart("gather buffer", 4 * shape.largest_layer, f"4 B x largest layer {shape.largest_layer:.3g}"))
    if not model.trained:
        return parts
    if offload_optimizer:
        return parts + [MemoryPart("optimizer states", 0, "on the CPU (offload)")]
    grads_split = ranks if stage >= 2 else 1
    if stage < 3:
            parts.append(MemoryPart("gradients", model.trainable * weight_bytes // grads_split, f"{weight_bytes} B x "
                                f"{model.trainable:.3g}" + (f" / {ranks} ranks" if grads_split > 1 else "")))
    if model.optimizer_state_bytes is None:
        return parts + [MemoryPart("optimizer states", None, "the optimizer does not say")]
    master = 8 * model.trainable if weight_bytes < 4 else 0
    split = ranks if stage >= 1 else 1
    note = (f"fp32 master + grads {master:.3g} B + optimizer {model.optimizer_state_bytes:.3g} B"
            + (f" / {split} ranks" if split > 1 else ""))
    return parts + [MemoryPart("optimizer states", (master + model.optimizer_state_bytes) // split, note)]


def format_bytes(nbytes: float | None) -> str:
    """``"13.4 GiB"``; ``"not estimated"`` for None."""
    if nbytes is None:
        return "not estimated"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(nbytes) < 1024 or unit == "GiB":
            return f"{nbytes:.1f} {unit}" if unit != "B" else f"{int(nbytes)} B"
        nbytes /= 1024
    return ""


def parse_bytes(text: str) -> int:
    """``"80GiB"``, ``"80 GB"``, ``"24G"``, ``"1.5TiB"`` or plain bytes; ValueError otherwise. GB means GiB here,
    as GPU makers' "80GB" means 80 GiB of device memory."""
    import re

    match = re.fullmatch(r"\s*([0-9.]+)\s*([KMGT]?)(i?B)?\s*", text, re.IGNORECASE)
    if not match:
        raise ValueError(f"{text!r} is not an amount of memory (e.g. 80GiB)")
    power = " KMGT".index(match.group(2).upper() or " ")
    return int(float(match.group(1)) * 1024**power)
