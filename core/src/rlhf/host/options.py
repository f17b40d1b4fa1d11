"""Per-plugin option namespaces (``--<namespace>.<field>`` flags, ``plugins.<namespace>`` in YAML)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlhf.registry import _import_target


class OptionsCollisionError(ValueError):
    """Two plugins (or a plugin and a core config section) claim the same option namespace."""


@dataclass
class PluginOptions:
    namespace: str
    plugin: str
    model: Any  # a pydantic BaseModel subclass, or a lazy "module:attr" string

    def model_class(self) -> Any:
        if isinstance(self.model, str):
            self.model = _import_target(self.model, f"options of plugin {self.plugin!r}")
        return self.model


class OptionsRegister:
    """The ``register`` object of :func:`rlhf.hookspecs.rlhf_register_options`.

    ``register(Model)`` declares the plugin's options under its own name;
    ``register(Model, namespace="x")`` picks another namespace.
    """

    def __init__(self, table: dict[str, PluginOptions], plugin: str) -> None:
        self._table = table
        self.plugin = plugin
        self.added: list[str] = []

    def __call__(self, model: Any, *, namespace: str | None = None) -> None:
        namespace = namespace or self.plugin
        if not namespace.isidentifier():
            raise ValueError(
                f"plugin {self.plugin!r}: option namespace {namespace!r} must be a Python identifier "
                "(it becomes the flag prefix --<namespace>.<field>)"
            )
        existing = self._table.get(namespace)
        if existing is not None:
            raise OptionsCollisionError(
                f"option namespace {namespace!r} is claimed by both plugin {existing.plugin!r} and plugin "
                f"{self.plugin!r}; one of them must pass register(Model, namespace=...) with another name"
            )
        self._table[namespace] = PluginOptions(namespace, self.plugin, model)
        self.added.append(namespace)
