"""The run's training backend (``--train.backend``): chosen by name from the registered ones."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlhf.components import build
from rlhf.components.first_use import ComponentLabel
from rlhf.registry import ComponentKind

#: The plugin API (docs/plugin-api.md); the module's other names may change in any release.
__all__ = ["backend_label", "check_backend_config", "training_backend"]

if TYPE_CHECKING:
    from rlhf.config.run import RunConfig


def backend_class(config: RunConfig, registry: Any) -> type:
    """The registered class ``--train.backend`` names; an unknown name is the usual one-line error."""
    return registry.get(ComponentKind.TRAINING_BACKEND, config.train.backend, flag="--train.backend")


def check_backend_config(config: RunConfig, registry: Any) -> None:
    """In the CLI process, before anything starts: the backend's own ``check_config`` refusals."""
    check = getattr(backend_class(config, registry), "check_config", None)
    if check is not None:
        check(config)


def training_backend(config: RunConfig, registry: Any) -> Any:
    """The backend of this process (a :class:`rlhf.components.TrainingBackend`), built from the run config."""

    return build(backend_class(config, registry), config)


def backend_label(config: RunConfig, registry: Any) -> ComponentLabel:
    """How a refusal by the library under the run's backend names it (:mod:`rlhf.components.first_use`)."""
    kind = ComponentKind.TRAINING_BACKEND
    return ComponentLabel.among(kind.label, config.train.backend, "--train.backend", registry.names(kind))
