"""What builds a model, its inputs and its optimizer: model loaders, processors, optimizers, schedulers.

Shapes and the build rules: :mod:`rlhf.components`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from rlhf.config.run import RunConfig


@runtime_checkable
class ModelLoader(Protocol):
    """Builds a model for a role (``actor``, ``critic``, ``ref``, ``reward``) inside its worker, once."""

    def load(self, path: str, role: str, config: RunConfig) -> Any: ...


@runtime_checkable
class Processor(Protocol):
    """Turns one dataset row into model inputs; runs in the data loader, once per row.

    Returns a dict with ``prompt_ids`` (a non-empty list of ints) and, for multimodal models,
    media entries (e.g. ``pixel_values``) the model loader's model accepts.

    Optional method the multi-turn executor calls when an environment step returns
    ``environment_images`` (in the controller, once per such feedback):
    ``extend(media, text, images) -> {"ids": list[int], "media": dict}``, the feedback's token ids
    (image tokens expanded) and the trajectory's media with the new images appended after its own.
    """

    def process(self, row: dict[str, Any]) -> dict[str, Any]: ...


@runtime_checkable
class OptimizerFactory(Protocol):
    """Builds the optimizer for one trained model inside its worker, once per model.

    ``deepspeed_config`` returns the ``optimizer`` block of the DeepSpeed config
    (or None when :meth:`build` constructs the optimizer itself).

    Optional methods the core calls when a factory defines them:

    * ``zero_config(stage: int) -> dict``: ``zero_optimization`` entries this optimizer requires at
      ZeRO ``stage`` (Muon needs ``reduce_scatter: false`` under ZeRO-3); called in the worker, once.
    * ``plan_state_bytes(shape, trainable) -> int`` (classmethod): bytes of the optimizer's own fp32 states for
      ``trainable`` parameters of a model of :class:`rlhf.planning.ModelShape` ``shape`` (Adam: 8 per parameter);
      read by ``rlhf plan`` in the CLI process (docs/plan.md). Absent: "not estimated".
    * ``check_config(section, flag) -> None``: validates the section before anything starts (in the
      CLI process for ``rlhf train ppo``; in each trainer rank for supervised runs); raises
      :class:`rlhf.errors.ConfigError` or logs a warning. ``flag("max_norm")`` names a field as
      the user spells it (``--actor.max_norm``, ``--train.max_norm``).
    """

    def deepspeed_config(self, section: Any) -> dict[str, Any] | None: ...

    def build(self, params: Any, section: Any) -> Any: ...


@runtime_checkable
class SchedulerFactory(Protocol):
    """Builds the learning-rate schedule for one optimizer inside its worker, once per model."""

    def build(self, optimizer: Any, num_training_steps: int, section: Any) -> Any: ...
