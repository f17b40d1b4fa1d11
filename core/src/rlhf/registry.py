"""Component registries filled by the registration hooks.

A plugin contributes components (an advantage estimator, a reward function, an
optimizer…) by calling the ``register`` object its registration hook receives.
The target is either the object itself or a lazy ``"module:attr"`` string, so a
plugin that registers a torch-heavy class costs nothing until that class is
selected by name.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Generic, TypeVar

from rlhf.errors import ConfigError
from rlhf.host.catalogue import first_party_providers

T = TypeVar("T")


class ComponentKind(str, Enum):
    """Every kind of component a plugin can register (one registration hook each)."""

    ADVANTAGE_ESTIMATOR = "advantage_estimator"
    POLICY_LOSS = "policy_loss"
    KL_ESTIMATOR = "kl_estimator"
    SAMPLE_FILTER = "sample_filter"
    TRAINER = "trainer"
    REWARD_FUNCTION = "reward_function"
    REWARD_SHAPER = "reward_shaper"
    AGENT_EXECUTOR = "agent_executor"
    MODEL_LOADER = "model_loader"
    PROCESSOR = "processor"
    OPTIMIZER = "optimizer"
    SCHEDULER = "scheduler"
    PRESET = "preset"
    COMMAND = "command"
    ROLLOUT_ENGINE = "rollout_engine"
    WEIGHT_SYNC_TRANSPORT = "weight_sync_transport"
    TRAINING_BACKEND = "training_backend"
    ROLLOUT_SCHEDULER = "rollout_scheduler"
    REWARD_MANAGER = "reward_manager"
    ROLLOUT_CORRECTION = "rollout_correction"
    PROMPT_SOURCE = "prompt_source"

    @property
    def hook_name(self) -> str:
        """The registration hook that contributes this kind, e.g. ``rlhf_register_optimizers``."""
        plural = "policy_losses" if self is ComponentKind.POLICY_LOSS else f"{self.value}s"
        return f"rlhf_register_{plural}"

    @property
    def label(self) -> str:
        return self.value.replace("_", " ")

    @property
    def plugin_kind(self) -> str:
        """The plugin kind (entry-point group ``rlhf.<kind>``) this component kind belongs to: what
        ``rlhf plugins --kind`` matches a plugin by, whichever group the plugin's entry point is in."""
        return _PLUGIN_KIND.get(self.value, "algorithms")


_PLUGIN_KIND = {"reward_function": "rewards", "reward_shaper": "rewards", "reward_manager": "rewards",
                "agent_executor": "agents", "prompt_source": "agents",
                "model_loader": "models", "processor": "models", "optimizer": "optimizers", "scheduler": "optimizers",
                "rollout_engine": "backends", "weight_sync_transport": "backends", "training_backend": "backends",
                "rollout_scheduler": "backends", "command": "tools"}


class ComponentError(ConfigError, LookupError):
    """A component name that is not registered, or a lazy target that does not import."""


class DuplicateComponentError(ValueError):
    """Two plugins registered the same name for the same kind."""

    def __init__(self, kind: ComponentKind, name: str, first: str, second: str) -> None:
        self.kind, self.name, self.first, self.second = kind, name, first, second
        super().__init__(
            f"{kind.label} {name!r} is registered by both plugin {first!r} and plugin {second!r}; "
            f"block one of them with --plugins no:{second} (or no:{first})"
        )


@dataclass
class Registration:
    """One registered component: where it comes from and how to load it."""

    kind: ComponentKind
    name: str
    target: Any  # the object, or a lazy "module:attr" string
    plugin: str
    description: str = ""
    _loaded: Any = field(default=None, repr=False)

    def load(self) -> Any:
        """Import the target on first use; the error names the plugin and the bad path."""
        if self._loaded is None:
            if not isinstance(self.target, str):
                self._loaded = self.target
            else:
                self._loaded = _import_target(self.target, f"{self.kind.label} {self.name!r} of plugin {self.plugin!r}")
        return self._loaded


def _import_target(path: str, owner: str) -> Any:
    module_name, _, attr = path.partition(":")
    if not attr:
        raise ComponentError(f"{owner} has target {path!r}; expected 'module:attribute'")
    try:
        obj: Any = importlib.import_module(module_name)
    except Exception as exc:  # the plugin's own import error, reported with its owner
        raise ComponentError(f"{owner}: cannot import {module_name!r}: {type(exc).__name__}: {exc}") from exc
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ComponentError(f"{owner}: module {module_name!r} has no attribute {attr!r}") from None
    return obj


class Register(Generic[T]):
    """The typed ``register`` object a registration hook receives.

    Call it as ``register(name, target, description="…")`` where ``target`` is the
    component (class or callable) or a lazy ``"module:attr"`` string. Registering a
    name another plugin already registered fails the whole plugin, naming both.
    """

    def __init__(self, registry: ComponentRegistry, kind: ComponentKind, plugin: str) -> None:
        self._registry = registry
        self.kind = kind
        self.plugin = plugin
        self.added: list[Registration] = []

    def __call__(self, name: str, target: T | str, *, description: str = "") -> None:
        if not isinstance(name, str) or not name or name != name.strip():
            raise ValueError(f"plugin {self.plugin!r}: {self.kind.label} name must be a non-empty string, got {name!r}")
        registration = Registration(self.kind, name, target, self.plugin, description)
        self._registry.add(registration)
        self.added.append(registration)


class ComponentRegistry:
    """All registered components, by kind then name, in registration order."""

    def __init__(self) -> None:
        self._by_kind: dict[ComponentKind, dict[str, Registration]] = {kind: {} for kind in ComponentKind}
        # name -> distribution that would provide it, for "did you install…" hints
        kinds = {kind.value: kind for kind in ComponentKind}
        self.known_providers: dict[tuple[ComponentKind, str], str] = {
            (kinds[kind], name): distribution for (kind, name), distribution in first_party_providers().items() if kind in kinds}
        #: distribution -> why it is installed but did not load (``incompatible: …`` or ``failed: …``), set by the host
        self.unavailable: dict[str, str] = {}
        #: (kind, name) -> the installed plugin that --plugins blocks and that registers it, set by the host
        self.blocked_provider: Callable[[ComponentKind, str], Any] | None = None

    def add(self, registration: Registration) -> None:
        table = self._by_kind[registration.kind]
        existing = table.get(registration.name)
        if existing is not None:
            raise DuplicateComponentError(registration.kind, registration.name, existing.plugin, registration.plugin)
        table[registration.name] = registration

    def remove_plugin(self, plugin: str) -> None:
        for table in self._by_kind.values():
            for name in [n for n, reg in table.items() if reg.plugin == plugin]:
                del table[name]

    def names(self, kind: ComponentKind) -> list[str]:
        return list(self._by_kind[kind])

    def registrations(self, kind: ComponentKind | None = None) -> list[Registration]:
        kinds = [kind] if kind else list(ComponentKind)
        return [reg for k in kinds for reg in self._by_kind[k].values()]

    def by_plugin(self, plugin: str) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for reg in self.registrations():
            if reg.plugin == plugin:
                out.setdefault(reg.kind.value, []).append(reg.name)
        return out

    def registration(self, kind: ComponentKind, name: str, *, flag: str | None = None) -> Registration:
        table = self._by_kind[kind]
        if name in table:
            return table[name]
        raise ComponentError(self.unknown_message(kind, name, flag=flag))

    def get(self, kind: ComponentKind, name: str, *, flag: str | None = None) -> Any:
        """The loaded component registered under ``name``; a clear error lists what is installed."""
        return self.registration(kind, name, flag=flag).load()

    def unknown_message(self, kind: ComponentKind, name: str, *, flag: str | None = None) -> str:
        installed = sorted(self.names(kind))
        where = f"{flag} " if flag else ""
        blocked = self.blocked_provider(kind, name) if self.blocked_provider is not None else None
        if blocked is not None:
            origin, _, _ = blocked.reason.removeprefix("blocked by ").removeprefix("not in the ").partition(" ")
            fix = f"remove no:{blocked.name} from {origin}" if " no:" in blocked.reason else f"add {blocked.name} to {origin}"
            provider = f"plugin {blocked.name!r}" + (f", {blocked.distribution}" if blocked.distribution else "")
            return f"{where}{name!r}: that {kind.label} is installed ({provider}) but {blocked.reason}; {fix}"
        msg = f"{where}{name!r}: no {kind.label} of that name is installed."
        close = difflib.get_close_matches(name, installed, n=1)
        if close:
            msg += f" Did you mean {close[0]!r}?"
        msg += f" Installed: {', '.join(installed) if installed else '(none)'}."
        provider = self.known_providers.get((kind, name))
        if provider in self.unavailable:
            msg += f" It is provided by {provider}, which is installed but {self.unavailable[provider]}"
        elif provider:
            msg += f" It is provided by {provider}: pip install {provider} (or check `rlhf plugins` if it is installed but blocked or failed)."
        return msg
