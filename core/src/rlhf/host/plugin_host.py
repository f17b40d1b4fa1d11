"""The plugin host: discovery, ``--plugins`` resolution, validation and a typed facade.

Nothing outside this module calls ``pm.hook.*``: the rest of the core uses the
typed methods of :class:`PluginHost`.

Load order (deterministic): the core built-ins, then entry points sorted by
(group, name), then ``--plugins`` modules and files in the order given. Each
plugin is checked in isolation — its rlhf-core range and the names it imports
(rlhf.host.compatibility), import, declared plugin API, hook signatures, unknown
hooks, registrations — and a failure is recorded with its reason and
skipped with one warning, or raised when the plugin was named explicitly or
strict mode is on.
"""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.metadata as metadata
import importlib.util
import logging
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pluggy

from rlhf import PROJECT_NAME, __version__, hookspecs
from rlhf.errors import PluginError, RlhfDeprecationWarning, UserError
from rlhf.host import compatibility
from rlhf.host.compatibility import SERVED, PluginFailure
from rlhf.host.options import OptionsRegister, PluginOptions
from rlhf.host.selection import BLOCKED, FAILED, INCOMPATIBLE, OK, PluginRecord, PluginSelection, canonical, file_plugin_name
from rlhf.registry import ComponentKind, ComponentRegistry, Register
from rlhf.steering import Steering, SteeringView

if TYPE_CHECKING:
    from rlhf.config.run import RunConfig

log = logging.getLogger("rlhf.plugins")

#: Entry-point groups, one per plugin kind.
PLUGIN_KINDS = ("algorithms", "rewards", "agents", "models", "optimizers", "backends", "tools")
ENTRY_POINT_GROUPS = tuple(f"rlhf.{kind}" for kind in PLUGIN_KINDS)

#: Core modules registered as plugins before anything else; they cannot be blocked.
BUILTIN_PLUGINS = {"core": "rlhf.host.builtin"}


class PluginLoadError(PluginError):
    """A plugin failed to load and was named explicitly, or strict mode is on."""


class PluginHost:
    """Loads plugins and is the only door to their hooks and components."""

    def __init__(self, selection: PluginSelection | None = None) -> None:
        self.selection = selection or PluginSelection()
        self.registry = ComponentRegistry()
        self.options: dict[str, PluginOptions] = {}
        self.records: list[PluginRecord] = []
        self._pm = pluggy.PluginManager(PROJECT_NAME)
        self._pm.add_hookspecs(hookspecs)
        self._ep_identities: set[str] = set()  # canonical entry-point and distribution names seen
        self._spec_names = sorted(n for n in dir(hookspecs) if n.startswith("rlhf_"))
        self._blocked_entry_points: dict[str, metadata.EntryPoint] = {}  # record name -> entry point, for hints
        self.registry.blocked_provider = self.blocked_provider

    # ------------------------------------------------------------------ loading

    @classmethod
    def load(cls, selection: PluginSelection | None = None, *, builtins: bool = True) -> PluginHost:
        """Discover and load plugins according to ``selection`` (autoload everything by default)."""
        host = cls(selection)
        if builtins:
            for name, module_name in BUILTIN_PLUGINS.items():
                host.add_module(importlib.import_module(module_name), name=name, source="builtin", kind="builtin")
        host._load_entry_points()
        host._load_named_modules()
        for item in host.selection.files:
            host.add_file(item)
        host._check_pins()
        host.selection.check_blocked_names(host.records, {r.name: r.plugin for r in host.registry.registrations()})
        return host

    def _entry_points(self) -> list[tuple[str, metadata.EntryPoint]]:
        every = metadata.entry_points()  # one scan of the installed distributions serves every group
        found = [(group, ep) for group in ENTRY_POINT_GROUPS for ep in every.select(group=group)]
        return sorted(found, key=lambda item: (item[0], item[1].name, item[1].value))

    def _load_entry_points(self) -> None:
        sel = self.selection
        for group, ep in self._entry_points():
            # one parse of the distribution's METADATA for its name and version (``dist.name`` and ``dist.version``
            # would parse it each); its requirements come from the distribution found (``dist.requires`` parses it
            # once more, and also reads an egg-info's requires.txt), where ``metadata.requires(name)`` would first
            # search sys.path for it again
            meta = ep.dist.metadata if ep.dist else None
            dist, version = (meta["Name"], meta["Version"]) if meta else (None, None)
            self._ep_identities.update(canonical(x) for x in (ep.name, dist) if x)
            kind = group.split(".", 1)[1]
            record = PluginRecord(ep.name, kind, "entry-point", ep.value, dist, version)
            if sel.is_blocked(ep.name, dist):
                record.status, record.reason = BLOCKED, f"blocked by {sel.origin} no:{ep.name}"
                self._blocked(record, ep)
                continue
            if sel.names is not None and not sel.explicitly_named(ep.name, dist):
                record.status, record.reason = BLOCKED, f"not in the {sel.origin} allow-list"
                self._blocked(record, ep)
                continue
            explicit = sel.explicitly_named(ep.name, dist)
            requires = (ep.dist.requires or []) if ep.dist else None
            self._load_one(record, lambda ep=ep: ep.load(), explicit, requires=requires)

    def _blocked(self, record: PluginRecord, ep: metadata.EntryPoint) -> None:
        self.records.append(record)
        self._blocked_entry_points[record.name] = ep
        if record.distribution:  # a first-party name it provides is then "installed but blocked", not "pip install"
            self.registry.unavailable[record.distribution] = record.reason

    def blocked_provider(self, kind: ComponentKind, name: str) -> PluginRecord | None:
        """The installed plugin that ``--plugins`` keeps out and that registers ``name`` of ``kind``, or None.

        Only for the message of an unknown name: each blocked plugin is loaded into a scratch host of its own
        (registration only imports ``rlhf``), and one that fails to load there is passed over."""
        for record in self.records:
            ep = self._blocked_entry_points.get(record.name)
            if ep is None:
                continue
            scratch = PluginHost(PluginSelection(names=(), origin="a hint"))
            try:
                scratch.add_module(ep.load(), name=record.name, kind=record.kind, explicit=True)
            except Exception:  # noqa: BLE001 - a blocked plugin that does not load registers nothing
                continue
            if name in scratch.registry.names(kind):
                return record
        return None

    def _load_named_modules(self) -> None:
        """Dotted modules, and allow-list names that match no installed plugin, are imported as plugins."""
        unmatched = [n for n in self.selection.names or () if canonical(n) not in self._ep_identities]
        for name in [*unmatched, *self.selection.modules]:
            if self.selection.is_blocked(name):
                continue
            record = PluginRecord(name, "module", "module", name)
            record.distribution, record.version = _distribution_of(name)
            self._load_one(record, lambda name=name: self._import_named(name), explicit=True)

    def _import_named(self, name: str) -> ModuleType:
        try:
            return importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                installed = sorted(self._ep_identities)
                close = difflib.get_close_matches(canonical(name), installed, n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise PluginFailure(
                    f"{name!r} is neither an installed plugin nor an importable module.{hint} "
                    f"Installed plugins: {', '.join(installed) or '(none)'}"
                ) from None
            raise

    def add_module(self, module: Any, *, name: str, source: str = "module", kind: str = "module", explicit: bool = True) -> PluginRecord:
        """Register an already-imported module or object as a plugin (used by tests and built-ins)."""
        record = PluginRecord(name, kind, source, getattr(module, "__name__", name))
        if source == "builtin":
            record.distribution, record.version = "rlhf-core", __version__
        return self._load_one(record, lambda: module, explicit)

    def add_file(self, path: str | Path) -> PluginRecord:
        """Load a plain ``.py`` file as a plugin (``--plugins ./my_reward.py``)."""
        file = Path(path).expanduser().resolve()
        record = PluginRecord(file_plugin_name(file), "file", "file", str(file))

        def importer() -> ModuleType:
            if not file.is_file():
                raise PluginFailure(f"plugin file {path} does not exist (resolved to {file})")
            record.sha256 = hashlib.sha256(file.read_bytes()).hexdigest()
            module_name = f"rlhf_file_plugin_{record.name}"
            spec = importlib.util.spec_from_file_location(module_name, file)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            sys.modules[module_name] = module  # so lazy "module:attr" targets into the file resolve
            try:
                spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop(module_name, None)
                raise
            return module

        return self._load_one(record, importer, explicit=True)

    def _load_one(self, record: PluginRecord, importer: Any, explicit: bool, requires: list[str] | None = None) -> PluginRecord:
        self.records.append(record)
        if any(r.status == OK and r.name == record.name for r in self.records[:-1]):
            other = next(r for r in self.records[:-1] if r.status == OK and r.name == record.name)
            return self._fail(record, f"plugin name {record.name!r} is already used by {other.source} {other.target!r}", explicit)
        try:
            cap = compatibility.check_core_range(record, refuse_caps=self.selection.refuses_caps, requires=requires)
            if record.source != "builtin":
                compatibility.check_imports(record)
            plugin = self._import(record, importer)
        except PluginFailure as exc:
            return self._fail(record, str(exc), explicit, status=exc.status)
        except BaseException as exc:  # noqa: BLE001 - a plugin's import may raise anything, even SystemExit
            if isinstance(exc, KeyboardInterrupt):
                raise
            removed = compatibility.removed_name_failure(exc)
            if removed is not None:
                return self._fail(record, str(removed), explicit, status=INCOMPATIBLE)
            return self._fail(record, f"import failed: {type(exc).__name__}: {exc}", explicit)
        try:
            record.api_version = compatibility.check_api(getattr(plugin, "rlhf_plugin_api", None), record.target)
            self._register(plugin, record)
        except PluginFailure as exc:
            return self._fail(record, str(exc), explicit, status=exc.status)
        if cap:
            record.warning = (f"its requirement {cap} excludes rlhf-core {__version__}; loaded anyway: it declares plugin "
                              f"API {record.api_version} and imports no removed name ({SERVED}); --strict-plugins "
                              "refuses it, and its maintainer can drop the upper cap")
            if self.selection.warns_of_caps:
                log.warning("plugin %r (%s %s): %s", record.name, record.distribution, record.version, record.warning)
        return record

    @staticmethod
    def _import(record: PluginRecord, importer: Any) -> Any:
        """Import a plugin; each deprecation warning its import raises is one log line naming it (the warnings
        filters still apply: pytest's ``-W error::rlhf.errors.RlhfDeprecationWarning`` makes it an error)."""
        with warnings.catch_warnings(record=True) as caught:
            plugin = importer()
        for warning in caught:
            if issubclass(warning.category, RlhfDeprecationWarning):
                log.warning("plugin %r: %s", record.name, warning.message)
            else:
                warnings.showwarning(warning.message, warning.category, warning.filename, warning.lineno)
        return plugin

    def _register(self, plugin: Any, record: PluginRecord) -> None:
        try:
            self._pm.register(plugin, name=record.name)
        except pluggy.PluginValidationError as exc:
            raise PluginFailure(f"invalid hook implementation: {' '.join(str(exc).split())}") from None
        except ValueError as exc:
            raise PluginFailure(str(exc)) from None
        try:
            callers = self._pm.get_hookcallers(plugin) or []
            record.hooks = sorted(c.name for c in callers)
            unknown = [c.name for c in callers if not c.has_spec()]
            if unknown:
                hints = []
                for name in unknown:
                    close = difflib.get_close_matches(name, self._spec_names, n=1)
                    hints.append(f"{name}" + (f" (did you mean {close[0]}?)" if close else ""))
                raise PluginFailure(f"implements unknown hook(s): {', '.join(hints)}")
            self._run_registrations(record)
        except BaseException:
            self._pm.unregister(name=record.name)
            self.registry.remove_plugin(record.name)
            for namespace in [ns for ns, opt in self.options.items() if opt.plugin == record.name]:
                del self.options[namespace]
            raise

    def _impls_of(self, hook_name: str, plugin_name: str) -> list[pluggy.HookImpl]:
        caller = getattr(self._pm.hook, hook_name)
        return [impl for impl in caller.get_hookimpls() if impl.plugin_name == plugin_name]

    def _run_registrations(self, record: PluginRecord) -> None:
        """Call this plugin's registration hooks alone, so every failure blames exactly it."""
        for kind in ComponentKind:
            for impl in self._impls_of(kind.hook_name, record.name):
                register: Register[Any] = Register(self.registry, kind, record.name)
                self._call_registration(impl, register, record)
        for impl in self._impls_of("rlhf_register_options", record.name):
            options_register = OptionsRegister(self.options, record.name)
            self._call_registration(impl, options_register, record)
            record.options.extend(options_register.added)
        record.components = self.registry.by_plugin(record.name)

    @staticmethod
    def _call_registration(impl: pluggy.HookImpl, register: Any, record: PluginRecord) -> None:
        try:
            impl.function(**({"register": register} if "register" in impl.argnames else {}))
        except Exception as exc:  # noqa: BLE001 - the plugin's own error, reported with its hook
            raise PluginFailure(f"{impl.function.__name__} raised {type(exc).__name__}: {exc}") from None

    def _fail(self, record: PluginRecord, reason: str, explicit: bool, status: str = FAILED) -> PluginRecord:
        record.status, record.reason = status, reason
        if record.distribution:  # a run naming one of its components is told why it is missing
            self.registry.unavailable[record.distribution] = f"{status}: {reason}"
        verb = "is incompatible" if status == INCOMPATIBLE else "failed to load"
        message = f"plugin {record.name!r} ({record.source} {record.target}) {verb}: {reason}"
        if explicit or self.selection.strict:
            raise PluginLoadError(message)
        log.warning("%s; skipped (use --strict-plugins to make this an error)", message)
        return record

    def _check_pins(self) -> None:
        """When reloading a run's resolved set, every plugin must be the same version / file content."""
        loaded = {r.name: r for r in self.records if r.status == OK}
        for name, version, sha256 in self.selection.pinned:
            record = loaded.get(name)
            if record is None:
                raise PluginLoadError(f"plugin {name!r} of the run's resolved plugin set is not available here; install it")
            if sha256 and record.sha256 != sha256:
                raise PluginLoadError(
                    f"plugin file {record.target} changed since the run started (sha256 {record.sha256} != {sha256}); "
                    "restore it or start a new run"
                )
            if version and record.version != version:
                raise PluginLoadError(
                    f"plugin {name!r} is version {record.version} here but the run used {version}; "
                    f"install {record.distribution or name}=={version}"
                )

    # ------------------------------------------------------------------- facade

    def loaded(self) -> list[PluginRecord]:
        return [r for r in self.records if r.status == OK]

    def resolved(self) -> list[dict[str, Any]]:
        """The resolved plugin set, stored in the run config and shipped to every worker."""
        return [r.resolved_entry() for r in self.loaded()]

    def worker_init(self, role: str, rank: int, config: RunConfig) -> None:
        self._notify("rlhf_worker_init", role=role, rank=rank, config=config)

    def train_start(self, config: RunConfig, run_dir: Path) -> None:
        self._notify("rlhf_train_start", config=config, run_dir=run_dir)

    def step_end(self, step: int, metrics: dict[str, float]) -> None:
        self._notify("rlhf_step_end", step=step, metrics=metrics)

    def rollout_samples(self, step: int, kind: str, samples: list[dict[str, Any]]) -> None:
        self._notify("rlhf_rollout_samples", step=step, kind=kind, samples=samples)

    def train_end(self, config: RunConfig, run_dir: Path, status: str) -> None:
        """Runs in a ``finally``: after a failed or interrupted run, a hook's own failure is logged
        so that it does not hide the error that ended the run."""
        try:
            self._notify("rlhf_train_end", config=config, run_dir=run_dir, status=status)
        except PluginError as exc:
            if status in ("completed", "stopped"):  # a run that ended normally: the hook's error is the error
                raise
            log.warning("%s (the run had already ended: %s)", exc, status)

    def checkpoint_save(self, step: int, checkpoint_dir: Path, state: dict[str, Any]) -> None:
        self._notify("rlhf_checkpoint_save", step=step, checkpoint_dir=checkpoint_dir, state=state)

    def checkpoint_load(self, step: int, checkpoint_dir: Path, state: dict[str, Any]) -> None:
        self._notify("rlhf_checkpoint_load", step=step, checkpoint_dir=checkpoint_dir, state=state)

    def steer(self, step: int, metrics: dict[str, float], view: SteeringView) -> list[Steering]:
        """Call each plugin's ``rlhf_steer`` with a handle of its own (in pluggy's call order), so that
        every request names its plugin; the handles that asked for something come back."""
        caller = self._pm.hook.rlhf_steer
        handles = []
        for impl in reversed(caller.get_hookimpls()):  # pluggy calls the last registered first
            handle = Steering(impl.plugin_name, view)
            arguments = {"step": step, "metrics": dict(metrics), "steering": handle}
            try:
                impl.function(**{name: arguments[name] for name in impl.argnames})
            except Exception as exc:
                raise self._hook_error("rlhf_steer", [impl], exc) from exc
            handles.append(handle)
        return handles

    def translate_argv(self, command: str, argv: list[str], known_flags: list[str], config_class: type | None) -> list[str]:
        """``argv`` after each plugin's ``rlhf_translate_argv``, applied in turn; a :class:`UserError` a plugin
        raises is the user's one error line as it is (it names the flag)."""
        for impl in reversed(self._pm.hook.rlhf_translate_argv.get_hookimpls()):  # pluggy calls the last registered first
            arguments = {"command": command, "argv": list(argv), "known_flags": known_flags, "config_class": config_class}
            try:
                result = impl.function(**{name: arguments[name] for name in impl.argnames})
            except UserError:
                raise
            except Exception as exc:
                raise self._hook_error("rlhf_translate_argv", [impl], exc) from exc
            if result is not None:
                argv = list(result)
        return argv

    def _notify(self, hook_name: str, **kwargs: Any) -> None:
        """Call a lifecycle hook; an implementation that raises becomes a :class:`PluginError`
        naming the plugin and the hook (its traceback with ``--debug``)."""
        caller = getattr(self._pm.hook, hook_name)
        try:
            caller(**kwargs)
        except Exception as exc:
            raise self._hook_error(hook_name, caller.get_hookimpls(), exc) from exc

    def _hook_error(self, hook_name: str, impls: list[pluggy.HookImpl], exc: Exception) -> PluginError:
        """The error naming the plugin whose hook raised; a :class:`UserError` it raised keeps its
        message (the user's fix), prefixed with the plugin and hook."""
        plugin = _raising_plugin(impls, exc) or "?"
        if isinstance(exc, UserError):  # the plugin reports the user's mistake: its message is the fix
            return PluginError(f"plugin {plugin!r} ({hook_name}): {exc}")
        record = next((r for r in self.records if r.name == plugin), None)
        leave_out = (f"remove {record.target} from --plugins" if record is not None and record.source in {"file", "module"}
                     else f"leave it out with --plugins no:{plugin}")
        return PluginError(f"plugin {plugin!r} failed in its {hook_name} hook: {type(exc).__name__}: {exc}; "
                           f"fix the plugin or {leave_out}")


def _raising_plugin(impls: list[pluggy.HookImpl], exc: BaseException) -> str | None:
    """The plugin whose hook implementation is on ``exc``'s traceback (outermost first)."""
    owners = {impl.function.__code__: impl.plugin_name for impl in impls}
    frame = exc.__traceback__
    while frame is not None:
        if frame.tb_frame.f_code in owners:
            return owners[frame.tb_frame.f_code]
        frame = frame.tb_next
    return None


def _distribution_of(module_name: str) -> tuple[str | None, str | None]:
    top = module_name.split(".", 1)[0]
    dists = metadata.packages_distributions().get(top) or []
    if not dists:
        return None, None
    try:
        return dists[0], metadata.version(dists[0])
    except metadata.PackageNotFoundError:
        return dists[0], None
