"""Moved and removed names of the plugin API, and how an old import path keeps working for a while.

The core serves every plugin API from :data:`rlhf.OLDEST_PLUGIN_API` to :data:`rlhf.PLUGIN_API_VERSION`
(docs/plugin-api.md). Within that window a moved module keeps its old import path: an alias of the new module
that warns once (:class:`~rlhf.errors.RlhfDeprecationWarning`) with the new path and the release that removes
the old one. A removed name raises :class:`~rlhf.errors.RemovedNameError` naming the release that removed it
and its replacement, and the plugin host refuses a plugin that imports one (:func:`removed_imports`).

A plugin library can deprecate its own moved names the same way, with a PEP 562 module ``__getattr__``::

    __getattr__ = deprecated_names(__name__, {"old_name": ("my_pkg.new_module:new_name", "my-pkg 2.0")})
"""

from __future__ import annotations

import ast
import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from rlhf.errors import RemovedNameError, RlhfDeprecationWarning

__all__ = ["MOVED_MODULES", "REMOVED", "Moved", "Removed", "deprecated_names", "release", "removed_imports"]


def release(api: int) -> str:
    """The release that serves plugin API ``api``: from plugin API 3 on, rlhf-core 0.N is plugin API N."""
    return f"rlhf-core 0.{api} (plugin API {api})" if api >= 3 else f"plugin API {api}"


@dataclass(frozen=True)
class Moved:
    """A module of the plugin API that moved: ``old`` (and every module under it) is an alias of ``new``."""

    old: str
    new: str
    deprecated_in: int  # the plugin API that moved it
    removed_in: int  # the plugin API whose core no longer has the alias (at least one API version later)
    distribution: str = "rlhf-core"  # the distribution that holds ``new``

    def message(self, old: str, new: str) -> str:
        where = f" (distribution {self.distribution})" if self.distribution != "rlhf-core" else ""
        return (f"{old} is deprecated: it moved to {new}{where} in plugin API {self.deprecated_in}; "
                f"import {new} instead, the old path is removed in {release(self.removed_in)}")


@dataclass(frozen=True)
class Removed:
    """A module, or a ``module:name``, that the core no longer has."""

    old: str
    removed_in: int
    replacement: str
    deprecated_in: int | None = None  # None: it was never public, so it had no deprecation window

    @property
    def name(self) -> str:
        return self.old.replace(":", ".")

    def message(self) -> str:
        return f"{self.name} was removed in {release(self.removed_in)}; use {self.replacement}"


#: Every moved module still served (docs/plugin-api.md's changelog lists each, with its removal).
MOVED_MODULES = (
    Moved("rlhf.supervised", "rlhf_supervised", 3, 5, "rlhf-supervised"),
    Moved("rlhf.config.supervised", "rlhf_supervised.config", 3, 5, "rlhf-supervised"),
    Moved("rlhf.data.conversations", "rlhf_supervised.conversations", 3, 5, "rlhf-supervised"),
    Moved("rlhf.agents", "rlhf_agents", 3, 5, "rlhf-agents"),
    Moved("rlhf.runtime.agent_engine", "rlhf_agents.executors", 2, 5, "rlhf-agents"),
)

#: Every removed name; internal modules that plugins of API 1 reached into are here too, with what replaced them.
REMOVED = (
    Removed("rlhf.engines.hf_models", 2, "rlhf.models.loading"),
)


def _moved(fullname: str) -> tuple[Moved, str] | None:
    """The move that covers ``fullname`` (the longest old prefix) and the module it now is."""
    for move in sorted(MOVED_MODULES, key=lambda m: -len(m.old)):
        if fullname == move.old or fullname.startswith(move.old + "."):
            return move, move.new + fullname[len(move.old):]
    return None


_warned: set[Moved] = set()


class _AliasLoader(importlib.abc.Loader):
    """Loads an old path as the new module itself (one module object: classes stay identical), warning once per
    move (``import rlhf.supervised.trainer`` imports the package ``rlhf.supervised`` first: one warning names both)."""

    def __init__(self, move: Moved, new: str) -> None:
        self.move, self.new = move, new

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        try:
            module = importlib.import_module(self.new)
        except ModuleNotFoundError as exc:
            if exc.name is None or not self.new.startswith(exc.name):
                raise
            raise RemovedNameError(f"{spec.name} moved to {self.new} in plugin API {self.move.deprecated_in}, "
                                   f"which the distribution {self.move.distribution} holds: "
                                   f"pip install {self.move.distribution}") from None
        if self.move not in _warned:
            _warned.add(self.move)
            # the frame is importlib's, whatever the stacklevel: the message names the old path to fix instead
            warnings.warn(self.move.message(spec.name, self.new), RlhfDeprecationWarning, stacklevel=2)
        return module

    def exec_module(self, module: ModuleType) -> None:
        """The new module is already executed."""


class _RemovedLoader(importlib.abc.Loader):
    def __init__(self, removed: Removed) -> None:
        self.removed = removed

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        raise RemovedNameError(self.removed.message())

    def exec_module(self, module: ModuleType) -> None:  # pragma: no cover - create_module always raises
        raise RemovedNameError(self.removed.message())


class _OldPathFinder(importlib.abc.MetaPathFinder):
    """First on ``sys.meta_path``, but answers only for the old paths of the tables above: a moved package's
    submodule must resolve to the new module, not be loaded a second time from the new package's folder."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if not fullname.startswith("rlhf."):
            return None
        found = _moved(fullname)
        if found is not None:
            return importlib.machinery.ModuleSpec(fullname, _AliasLoader(*found))
        # a removed module, or a package gone with it (rlhf.engines of rlhf.engines.hf_models) unless it still exists
        removed = next((r for r in REMOVED if r.old == fullname), None) or next(
            (r for r in REMOVED if r.old.startswith(fullname + ".")
             and importlib.machinery.PathFinder.find_spec(fullname, path) is None), None)
        return importlib.machinery.ModuleSpec(fullname, _RemovedLoader(removed)) if removed else None


def install() -> None:
    """Called once by ``import rlhf``: old paths resolve, and the deprecation warnings are shown once each (Python
    hides DeprecationWarning outside ``__main__``); pytest's ``-W error::rlhf.errors.RlhfDeprecationWarning`` is applied
    in front of this filter, so a plugin's tests can still make them errors."""
    if not any(isinstance(finder, _OldPathFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _OldPathFinder())
    if not any(isinstance(category, type) and issubclass(category, RlhfDeprecationWarning) for *_, category, _, _ in warnings.filters):
        warnings.filterwarnings("default", category=RlhfDeprecationWarning)


def deprecated_names(module_name: str, moved: dict[str, tuple[str, str]]) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) that serves each old name of ``moved`` (old name -> (``"module:name"``
    it moved to, the release that removes the old one)), warning once per name."""
    warned: set[str] = set()

    def __getattr__(name: str) -> Any:
        if name not in moved:
            raise AttributeError(f"module {module_name!r} has no attribute {name!r}")
        target, removed_in = moved[name]
        new_module, _, new_name = target.partition(":")
        if name not in warned:
            warned.add(name)
            warnings.warn(f"{module_name}.{name} is deprecated: import {new_name} from {new_module} instead; "
                          f"the old name is removed in {removed_in}", RlhfDeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module(new_module), new_name)

    return __getattr__


def removed_imports(files: Iterable[Path]) -> list[tuple[Removed, Path, int]]:
    """Every import of a removed name in ``files`` (module top or inside functions: a component module is
    imported only when a run selects it), with its file and line. Files that mention no removed name are not
    parsed, so a whole installed package is checked in milliseconds."""
    needles = {r.name.rsplit(".", 1)[-1] for r in REMOVED}
    found = []
    for file in files:
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if not any(needle in text for needle in needles):
            continue
        try:
            tree = ast.parse(text, str(file))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            for imported in _imported_names(node):
                removed = next((r for r in REMOVED if imported in (r.old, r.name)), None)
                if removed is not None:
                    found.append((removed, file, node.lineno))
    return found


def _imported_names(node: ast.AST) -> list[str]:
    """``import a.b`` -> a.b; ``from a import b`` -> a, a.b and a:b (b may be a module or a name)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.module and not node.level:
        return [node.module, *(f"{node.module}.{a.name}" for a in node.names), *(f"{node.module}:{a.name}" for a in node.names)]
    return []
