"""Whether a plugin can run on this core: by what it needs and what it uses, not by the version it was built with.

This core serves every plugin API from :data:`rlhf.OLDEST_PLUGIN_API` to :data:`rlhf.PLUGIN_API_VERSION`. A plugin
is incompatible only when it needs more (a newer plugin API, or an ``rlhf-core`` range whose lower bound is above
this core) or imports a name the core has removed (:data:`rlhf.deprecation.REMOVED`). An upper cap in its
``rlhf-core`` requirement that excludes this core is no reason by itself: pip's resolver keeps a plugin to its cap,
but one that is here anyway and passes these checks loads, with one warning (``--strict-plugins`` refuses it).
"""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlhf import OLDEST_PLUGIN_API, PLUGIN_API_VERSION, __version__
from rlhf.deprecation import release, removed_imports
from rlhf.errors import RemovedNameError
from rlhf.host.selection import FAILED, INCOMPATIBLE

if TYPE_CHECKING:
    from packaging.requirements import Requirement

    from rlhf.host.selection import PluginRecord

SERVED = f"rlhf-core {__version__} serves plugin API {OLDEST_PLUGIN_API} to {PLUGIN_API_VERSION}"


class PluginFailure(Exception):
    """One plugin's precise failure reason, with its fix; ``status`` FAILED or INCOMPATIBLE."""

    def __init__(self, reason: str, status: str = FAILED) -> None:
        super().__init__(reason)
        self.status = status


def incompatible(reason: str) -> PluginFailure:
    return PluginFailure(reason, INCOMPATIBLE)


def core_requirement(record: PluginRecord, requires: list[str] | None = None) -> Requirement | None:
    """The ``rlhf-core`` requirement of the plugin's distribution, if it has one (``requires``: its
    ``Requires-Dist`` lines, when the caller has read them already)."""
    if not record.distribution:
        return None
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        lines = (metadata.requires(record.distribution) or []) if requires is None else requires
    except metadata.PackageNotFoundError:
        return None
    for line in lines:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if requirement.name == "rlhf-core" and not requirement.marker:
            return requirement
    return None


def check_core_range(record: PluginRecord, *, refuse_caps: bool, requires: list[str] | None = None) -> str:
    """Before the plugin is imported: raise :func:`incompatible` when its ``rlhf-core`` range needs a newer core
    (or caps this one out, with ``refuse_caps``); return the cap (``rlhf-core<0.2,>=0.1``) when only an upper bound
    excludes this core, else ``""``."""
    requirement = core_requirement(record, requires)
    if requirement is None or requirement.specifier.contains(__version__, prereleases=True):
        return ""
    from packaging.version import Version

    this = Version(__version__)
    needs_newer = [s for s in requirement.specifier if not s.contains(this, prereleases=True)
                   and (s.operator in (">", ">=") or (s.operator in ("==", "~=", "===") and Version(s.version.rstrip(".*")) > this))]
    built_for = f"rlhf-core{requirement.specifier}"
    if needs_newer:
        raise incompatible(f"needs {built_for}, but this is rlhf-core {__version__}: pip install -U '{built_for}'")
    if refuse_caps:
        raise incompatible(f"is built for {built_for}, which excludes rlhf-core {__version__}, and --strict-plugins refuses "
                           f"an upper cap: pip install '{built_for}', or leave out --strict-plugins ({SERVED})")
    return built_for


def check_api(declared: Any, target: str) -> int:
    """The plugin API a plugin module declares must be served here."""
    if declared is None:
        raise PluginFailure(f"declares no plugin API version; add `rlhf_plugin_api = {PLUGIN_API_VERSION}` "
                           f"(the lowest plugin API it needs) to {target}")
    if not isinstance(declared, int) or isinstance(declared, bool):
        raise PluginFailure(f"declares rlhf_plugin_api = {declared!r} in {target}; it must be an int, "
                           f"e.g. rlhf_plugin_api = {PLUGIN_API_VERSION}")
    if declared > PLUGIN_API_VERSION:
        raise incompatible(f"needs plugin API {declared}, but {SERVED}: pip install -U 'rlhf-core>=0.{declared}'")
    if declared < OLDEST_PLUGIN_API:
        raise incompatible(f"targets plugin API {declared}, which {SERVED} no longer serves: install a release of the "
                           f"plugin built for plugin API {OLDEST_PLUGIN_API} or later")
    return declared


def check_imports(record: PluginRecord) -> None:
    """The plugin's source files import no removed name (a component module is read, not imported: it is
    imported only where a run selects the component)."""
    found = removed_imports(plugin_files(record))
    if found:
        removed, file, line = found[0]
        fix = (f"pip install -U {record.distribution} (a release built for plugin API {PLUGIN_API_VERSION}), or change that "
               "import" if record.distribution else "change that import")
        raise incompatible(f"{file.name} line {line} imports {removed.name}, removed in {release(removed.removed_in)}; "
                           f"use {removed.replacement}: {fix}")


def removed_name_failure(exc: BaseException) -> PluginFailure | None:
    """An import that failed on a removed name (the plugin's top module imported it) is incompatibility."""
    while exc is not None:
        if isinstance(exc, RemovedNameError):
            return incompatible(f"imports {exc}")
        exc = exc.__cause__ or exc.__context__
    return None


def plugin_files(record: PluginRecord) -> list[Path]:
    """The Python files of a plugin: its file, or every module of the top-level package its target is in."""
    if record.source == "file":
        return [Path(record.target)]
    top = record.target.split(":", 1)[0].split(".", 1)[0]
    if top == "rlhf":  # the core's own plugins
        return []
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    if spec.submodule_search_locations:
        return [f for location in spec.submodule_search_locations for f in sorted(Path(location).rglob("*.py"))]
    return [Path(spec.origin)] if spec.origin and spec.origin.endswith(".py") else []
