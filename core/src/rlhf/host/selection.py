"""What ``--plugins`` / ``RLHF_PLUGINS`` ask for, and what the host recorded for each plugin.

Semantics (the same for the flag and the environment variable):

* unset: every installed plugin (entry points of the ``rlhf.<kind>`` groups) loads;
* ``a,b`` (entry-point or distribution names): only those load — an allow-list;
* ``no:c``: ``c`` is blocked (by entry-point or distribution name);
* ``pkg.module`` (a dotted path): that module is also imported and registered as a
  plugin; like a file, it adds to the selection rather than switching to an allow-list;
* ``./file.py`` (anything ending in ``.py`` or containing a path separator): that file
  is loaded as a plugin, without packaging;
* the empty string: no installed plugin loads (the core built-ins still do).

Precedence: the ``--plugins`` flag, when given, replaces ``RLHF_PLUGINS`` entirely.
Strict mode (``--strict-plugins`` or ``RLHF_STRICT_PLUGINS=1``) turns every plugin
failure into an error; without it, only plugins named explicitly fail hard. It also refuses a
plugin whose ``rlhf-core`` requirement caps out this core, which otherwise loads with a warning
when it passes its checks (docs/plugin-api.md).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from rlhf.errors import PluginError

ENV_PLUGINS = "RLHF_PLUGINS"
ENV_STRICT = "RLHF_STRICT_PLUGINS"

#: Record statuses shown by ``rlhf plugins``. INCOMPATIBLE: needs a newer core (its declared plugin API or its
#: rlhf-core range), or imports a name the core has removed.
OK, BLOCKED, FAILED, INCOMPATIBLE = "ok", "blocked", "failed", "incompatible"

#: What to do with an upper cap in a plugin's rlhf-core requirement that excludes this core, when the plugin passes
#: its checks: warn (default), refuse (--strict-plugins), or nothing (a run's resolved set: the CLI already warned).
CAPS_WARN, CAPS_REFUSE, CAPS_QUIET = "warn", "refuse", "quiet"


def canonical(name: str) -> str:
    """Distribution-name normalisation (PEP 503), also applied to entry-point names when matching."""
    return re.sub(r"[-_.]+", "-", name).lower()


def is_file_item(item: str) -> bool:
    return item.endswith(".py") or "/" in item or os.sep in item


@dataclass(frozen=True)
class PluginSelection:
    """A parsed ``--plugins`` value."""

    names: tuple[str, ...] | None = None  # None: autoload everything installed
    blocked: tuple[str, ...] = ()
    modules: tuple[str, ...] = ()
    files: tuple[str, ...] = ()
    strict: bool = False
    caps: str = CAPS_WARN
    origin: str = "default"  # where the spec came from, for error messages
    # exact versions / hashes to enforce (set when reloading a run's resolved set)
    pinned: tuple[tuple[str, str | None, str | None], ...] = ()

    @classmethod
    def parse(cls, spec: str | None, *, strict: bool = False, origin: str = "--plugins") -> PluginSelection:
        caps = CAPS_REFUSE if strict else CAPS_WARN
        if spec is None:
            return cls(strict=strict, caps=caps, origin="default")
        names: list[str] = []
        blocked: list[str] = []
        modules: list[str] = []
        files: list[str] = []
        for raw in spec.split(","):
            item = raw.strip()
            if not item:
                continue
            if item.startswith("no:"):
                target = item[3:].strip()
                if not target:
                    raise ValueError(f"{origin}: 'no:' must be followed by a plugin name")
                blocked.append(target)
            elif is_file_item(item):
                files.append(item)
            elif "." in item:
                modules.append(item)
            else:
                names.append(item)
        # "no:x", modules and files alone keep autoload on; any plain name (or an empty spec)
        # switches to an allow-list
        allow: tuple[str, ...] | None = tuple(names)
        if not names and (blocked or modules or files):
            allow = None
        return cls(
            names=allow, blocked=tuple(blocked), modules=tuple(modules), files=tuple(files), strict=strict, caps=caps,
            origin=origin,
        )

    @classmethod
    def from_cli(cls, flag_value: str | None, strict_flag: bool = False) -> PluginSelection:
        """Combine the flag and the environment with the documented precedence."""
        strict = strict_flag or os.environ.get(ENV_STRICT, "").strip().lower() in {"1", "true", "yes", "on"}
        if flag_value is not None:
            return cls.parse(flag_value, strict=strict, origin="--plugins")
        env_value = os.environ.get(ENV_PLUGINS)
        if env_value is not None:
            return cls.parse(env_value, strict=strict, origin=ENV_PLUGINS)
        return cls(strict=strict, caps=CAPS_REFUSE if strict else CAPS_WARN)

    @classmethod
    def from_resolved(cls, records: list[dict[str, Any]], *, strict: bool = True) -> PluginSelection:
        """The selection that reloads exactly a run's resolved plugin set (workers, resumes)."""
        names, modules, files, pinned = [], [], [], []
        for rec in records:
            if rec.get("source") == "builtin":
                continue
            if rec.get("source") == "file":
                files.append(rec["target"])
            elif rec.get("source") == "module":
                modules.append(rec["target"])
            else:
                names.append(rec["name"])
            pinned.append((rec["name"], rec.get("version"), rec.get("sha256")))
        return cls(
            names=tuple(names), modules=tuple(modules), files=tuple(files), strict=strict, caps=CAPS_QUIET,
            origin="resolved plugin set", pinned=tuple(pinned),
        )

    @property
    def refuses_caps(self) -> bool:
        return self.caps == CAPS_REFUSE

    @property
    def warns_of_caps(self) -> bool:
        return self.caps == CAPS_WARN

    def explicitly_named(self, *identities: str | None) -> bool:
        wanted = {canonical(n) for n in (self.names or ())}
        return any(i is not None and canonical(i) in wanted for i in identities)

    def is_blocked(self, *identities: str | None) -> bool:
        blocked = {canonical(n) for n in self.blocked}
        return any(i is not None and canonical(i) in blocked for i in identities)

    def check_blocked_names(self, records: Iterable[PluginRecord], components: dict[str, str]) -> None:
        """Every ``no:NAME`` names a plugin the host saw (a blocked name that matches nothing would block
        nothing, silently). ``components`` maps a registered component name to its plugin, for the hint."""
        records = list(records)
        builtin = {canonical(i) for r in records if r.source == "builtin" for i in (r.name, r.distribution) if i}
        known = {canonical(i) for r in records if r.source != "builtin" for i in (r.name, r.distribution) if i}
        for name in self.blocked:
            if canonical(name) in builtin:
                raise PluginError(f"{self.origin} no:{name}: {name!r} is built into rlhf and cannot be blocked")
            if canonical(name) in known:
                continue
            if name in components:
                hint = f"it is a component of plugin {components[name]!r}: block the plugin with no:{components[name]}"
            else:
                close = difflib.get_close_matches(canonical(name), sorted(known), n=1)
                hint = f"did you mean no:{close[0]}?" if close else f"installed plugins: {', '.join(sorted(known)) or '(none)'}"
            raise PluginError(f"{self.origin} no:{name}: no installed plugin is called {name!r}; {hint}")


@dataclass
class PluginRecord:
    """What the host knows about one plugin, loaded or not. Shown by ``rlhf plugins``."""

    name: str
    kind: str  # entry-point kind (algorithms, rewards…), or "builtin" / "module" / "file"
    source: str  # "builtin", "entry-point", "module" or "file"
    target: str  # the entry-point value, module name, or absolute file path
    distribution: str | None = None
    version: str | None = None
    sha256: str | None = None
    status: str = OK
    reason: str = ""
    warning: str = ""  # loaded, but the user should know (an upper cap that excludes this core)
    api_version: int | None = None
    hooks: list[str] = field(default_factory=list)
    components: dict[str, list[str]] = field(default_factory=dict)
    options: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def resolved_entry(self) -> dict[str, Any]:
        """The identity stored in a run's config so workers and resumes load exactly this plugin."""
        return {k: getattr(self, k) for k in ("name", "kind", "source", "target", "distribution", "version", "sha256")}


def file_plugin_name(path: Path) -> str:
    return re.sub(r"\W", "_", path.stem)
