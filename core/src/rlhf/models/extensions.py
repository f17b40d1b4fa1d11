"""Model plugins behind core flags: Liger kernels, ring attention, vision-language models.

The core keeps OpenRLHF's flags (``--ds.use_liger_kernel``, ``--ds.ring_attn_size``,
``--data.image_key``…) and marks each with the registered name of the model plugin that
implements it (``flag(plugin="liger")``). A run that sets such a flag builds that plugin's
component (kind ``model_loader``) in every model worker and calls its optional methods around
model loading:

* ``prepare(role, config)``: before the model loads, after the process group exists (check the
  machine, patch modeling code, create process groups). Raise :class:`rlhf.errors.ConfigError`
  naming the flag when this machine cannot run it.
* ``load(path, role, config)``: load the model instead of the core (a vision-language model);
  return None to leave a role to the core.
* ``wrap(model, role, config)``: after loading and LoRA, before DeepSpeed; return the model to use.

``role`` is ``actor``, ``ref``, ``critic`` or ``reward`` (``sft``-style trainers pass ``actor``).
Runs in the model workers (and the supervised trainer's ranks), once per model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlhf.components import build
from rlhf.config.base import flagged_fields
from rlhf.registry import ComponentKind

if TYPE_CHECKING:
    from rlhf.config.run import RunConfig


def active(config: RunConfig, registry: Any) -> list[Any]:
    """The model-plugin components this run switched on, built once each, in flag order."""

    flags: dict[str, str] = {}  # plugin -> the first of its flags that is set
    loaders = registry.names(ComponentKind.MODEL_LOADER)
    for dotted, plugin, changed in flagged_fields(config):
        if changed and plugin in loaders:
            flags.setdefault(plugin, f"--{dotted}")
    for name in getattr(getattr(config, "train", None), "model_loaders", None) or []:
        flags.setdefault(name, "--train.model_loaders")
    return [build(registry.get(ComponentKind.MODEL_LOADER, name, flag=flag), config) for name, flag in flags.items()]


def load_model(extensions: list[Any], role: str, config: RunConfig, path: str, default: Callable[[], Any]) -> Any:
    """``prepare`` every extension, load (the first extension's ``load`` that returns a model, else
    ``default()``), then ``wrap``; ``default`` is the core's own loader (LoRA included)."""
    for extension in extensions:
        prepare = getattr(extension, "prepare", None)
        if prepare is not None:
            prepare(role, config)
    model = None
    for extension in extensions:
        load = getattr(extension, "load", None)
        if load is not None and (model := load(path, role, config)) is not None:
            break
    if model is None:
        model = default()
    for extension in extensions:
        wrap = getattr(extension, "wrap", None)
        if wrap is not None:
            model = wrap(model, role, config)
    return model
