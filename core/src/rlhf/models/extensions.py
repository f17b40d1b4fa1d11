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

Per-token records, from the rollout engine to the trainer's forward (e.g. the experts each token was routed to):

* ``record(module, rows) -> context manager`` (engines): entered around one ``generate`` call of ``rows``
  sequences on the HF ``module``; the value it yields, called after the block, returns ``{name: tensor}``, each
  ``(rows, positions, ...)`` over every position the calls forwarded, in order (the prompt's width, then one per
  decoding step). The engine cuts each sequence's own positions out (:func:`recording`) and returns them as
  ``GenerationResult.token_records``; the controller carries them with the sample to the model workers.
* ``before_forward(module, tokens: ForwardTokens)`` (model workers): before every forward of the actor and the
  reference (old/reference log-probs, each training micro-batch), with where each sample sits in the forward's
  ``(R, L)`` input and what its engine recorded; a forward with no records passes None for each.
* ``plan_memory(config, model: rlhf.planning.PlannedModel) -> list[rlhf.planning.MemoryPart]``: what the extension
  adds to one GPU of ``model``'s group, for ``rlhf plan`` (in the CLI process, once per model group planned).
* ``metrics() -> dict[str, float]``: after each actor training call, once per step and rank; what the extension
  measured since the last call (averaged over the ranks into ``metrics.jsonl``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rlhf.components import build
from rlhf.config.base import flagged_fields
from rlhf.config.ppo import PPOConfig
from rlhf.host.plugin_host import PluginHost
from rlhf.host.selection import PluginSelection
from rlhf.registry import ComponentKind

if TYPE_CHECKING:
    from rlhf.config.run import RunConfig


def _switched_on(config: RunConfig) -> dict[str, str]:
    """plugin -> the first of its flags this run set (any kind of plugin), then ``--train.model_loaders``' names."""
    flags: dict[str, str] = {}
    for dotted, plugin, changed in flagged_fields(config):
        if changed:
            flags.setdefault(plugin, f"--{dotted}")
    for name in getattr(getattr(config, "train", None), "model_loaders", None) or []:
        flags.setdefault(name, "--train.model_loaders")
    return flags


def active(config: RunConfig, registry: Any) -> list[Any]:
    """The model-plugin components this run switched on, built once each, in flag order."""

    loaders = registry.names(ComponentKind.MODEL_LOADER)
    return [build(registry.get(ComponentKind.MODEL_LOADER, name, flag=flag), config)
            for name, flag in _switched_on(config).items() if name in loaders]


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


@dataclass
class ForwardTokens:
    """Where a forward's samples sit in its ``(R, L)`` ``input_ids`` (right-padded rows, or one packed row) and what the
    rollout engine recorded for each: sample ``i`` occupies row ``rows[i]`` from position ``starts[i]`` on, for
    ``lengths[i]`` positions (prompt then response)."""

    shape: tuple[int, int]
    rows: list[int]
    starts: list[int]
    lengths: list[int]
    #: per sample, its ``GenerationResult.token_records`` (arrays over its first positions), or None
    records: list[dict[str, Any] | None]
    #: a training forward (with gradients) of the actor, not a log-prob pass
    training: bool = False


def engine_extensions(config: dict[str, Any]) -> list[Any]:
    """The model extensions a run switched on, built in a rollout engine's own process from the config dict it gets
    (an in-rank engine gets its rank's instead: ``use_extensions``, :class:`rlhf.components.RolloutEngine`). No plugin
    is loaded unless the config sets a plugin's flag; then the run's exact plugin set (``plugin_set``) is, as its
    workers load it: not every installed plugin again (a skipped one would warn a second time where the engine shares
    the controller's process). A config without one (an engine built outside a run) loads what is installed."""
    validated = PPOConfig.model_validate(config)
    if not _switched_on(validated):
        return []
    resolved = config.get("plugin_set")
    host = PluginHost.load(PluginSelection.from_resolved(resolved)) if resolved else PluginHost.load()
    return active(validated, host.registry)


@contextlib.contextmanager
def recording(extensions: list[Any], module: Any, prompt_lengths: list[int], width: int) -> Iterator[Callable[[list[int]], list[dict[str, Any]]]]:
    """Around one ``generate`` call of left-padded prompts (``width`` wide) on ``module``: yields ``cut(response_lengths)``,
    which after the call returns each sequence's records (``GenerationResult.token_records``, numpy arrays over its
    prompt and response positions that were forwarded: ``prompt + response - 1``, the last token never is)."""
    with contextlib.ExitStack() as stack:
        taken = [stack.enter_context(e.record(module, len(prompt_lengths))) for e in extensions if hasattr(e, "record")]

        def cut(response_lengths: list[int]) -> list[dict[str, Any]]:
            out: list[dict[str, Any]] = [{} for _ in prompt_lengths]
            for recorded in taken:
                for name, tensor in recorded().items():
                    for i, (prompt, response) in enumerate(zip(prompt_lengths, response_lengths)):
                        out[i][name] = tensor[i, width - prompt : width + response - 1].cpu().numpy()
            return out

        yield cut


def before_forward(extensions: list[Any], module: Any, tokens: ForwardTokens) -> None:
    """Every extension's ``before_forward`` (see the module's docstring)."""
    for extension in extensions:
        hook = getattr(extension, "before_forward", None)
        if hook is not None:
            hook(module, tokens)


def extension_metrics(extensions: list[Any]) -> dict[str, float]:
    """What the extensions measured since the last call (their ``metrics()``)."""
    out: dict[str, float] = {}
    for extension in extensions:
        if hasattr(extension, "metrics"):
            out.update(extension.metrics())
    return out
