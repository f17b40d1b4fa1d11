"""What every kit shares: the one-line failure, input descriptions, and the kind-independent checks.

A property is checked on inputs ordered from the smallest up, so the first failure
reported is the smallest input that shows it.
"""

from __future__ import annotations

import inspect
import pickle
import subprocess
import sys
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from typing import Any, ClassVar

from rlhf.components import build
from rlhf.config.ppo import PPOConfig
from rlhf.host.plugin_host import PluginHost
from rlhf.host.selection import PluginSelection
from rlhf.registry import ComponentKind

#: Modules a plugin module must not import at its top: ``rlhf plugins`` and every Ray worker load it.
HEAVY_MODULES = ("torch", "transformers", "deepspeed", "vllm", "ray")


class ConformanceFailure(AssertionError):
    """One broken property of a component contract, in one line: kind, property, smallest input, what went wrong."""

    def __init__(self, kind: str, prop: str, detail: str, example: str = "") -> None:
        self.kind, self.prop, self.detail, self.example = kind, prop, detail, example
        where = f" on {example}" if example else ""
        super().__init__(" ".join(f"{kind} conformance: {prop} failed{where}: {detail}".split()))


def fail(kind: str, prop: str, detail: str, example: str = "") -> ConformanceFailure:
    return ConformanceFailure(kind, prop, detail, example)


def show(value: Any, limit: int = 12) -> str:
    """A tensor or list in a few characters: its values when small, else its shape and dtype."""
    if hasattr(value, "tolist") and hasattr(value, "shape"):
        if value.numel() <= limit:
            return repr(_round(value.float().tolist() if value.is_floating_point() else value.tolist()))
        return f"<{tuple(value.shape)} {str(value.dtype).replace('torch.', '')}>"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _round(values: Any) -> Any:
    if isinstance(values, list):
        return [_round(v) for v in values]
    return round(values, 4) if isinstance(values, float) else values


#: Set while :class:`ContractProperties` runs a contract: property -> its failure or None, instead of raising
_recorded: ContextVar[dict[str, ConformanceFailure | None] | None] = ContextVar("rlhf_kit_recorded", default=None)


def first_failure(kind: str, prop: str, cases: Iterable[tuple[str, Callable[[], str | None]]]) -> None:
    """Run ``(description, check)`` pairs smallest first; a check returns None or what went wrong.
    An exception raised by the component counts as a failure of that case. While a kit records its
    properties one by one (:class:`ContractProperties`) a failure is recorded and the contract goes on."""
    recorded = _recorded.get()
    for description, check in cases:
        try:
            problem = check()
        except ConformanceFailure:
            raise
        except Exception as exc:  # noqa: BLE001 - the component's own error is the finding
            problem = f"raised {type(exc).__name__}: {exc}"
        if problem:
            if recorded is None:
                raise fail(kind, prop, problem, description)
            recorded[prop] = recorded.get(prop) or fail(kind, prop, problem, description)
            return
    if recorded is not None:
        recorded.setdefault(prop, None)


def check_picklable(kind: str, component: Any) -> Any:
    """Ray ships components between processes with pickle (cloudpickle for classes defined in tests)."""
    try:
        return pickle.loads(pickle.dumps(component))
    except Exception as exc:  # noqa: BLE001
        raise fail(kind, "picklable for Ray", f"pickle round trip raised {type(exc).__name__}: {exc}") from None


def check_import_is_light(kind: str, module: str) -> None:
    """Importing the plugin module (what ``rlhf plugins`` and every worker do) imports no heavy library."""
    code = (f"import sys, importlib; importlib.import_module({module!r}); "
            f"print(','.join(m for m in {HEAVY_MODULES!r} if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        tail = (result.stderr.strip().splitlines() or ["?"])[-1]
        raise fail(kind, "registration is cheap", f"importing {module} failed: {tail}")
    heavy = result.stdout.strip()
    if heavy:
        raise fail(kind, "registration is cheap", f"importing {module} imports {heavy} at module top; import it inside "
                   "the component's methods and register a lazy 'module:attr' string")


def load_plugin(module: str, label: str, *, every_installed: bool = False) -> Any:
    """A real plugin host with ``module`` loaded (API version, hook signatures, registrations checked):
    alone, or with ``every_installed`` plugin too (a trainer's defaults name other plugins' components)."""
    import importlib

    selection = PluginSelection(origin="conformance kit") if every_installed else \
        PluginSelection(names=(), strict=True, origin="conformance kit")
    host = PluginHost.load(selection)
    if any(record.target == module and record.status == "ok" for record in host.records):
        return host  # installed, and loaded through its entry point
    try:
        host.add_module(importlib.import_module(module), name=module.rsplit(".", 1)[-1])
    except Exception as exc:  # noqa: BLE001
        raise fail(label, "plugin loads", f"{type(exc).__name__}: {exc}") from None
    return host


def check_registers(kind: ComponentKind, module: str, name: str) -> Any:
    """The plugin module loads into a fresh host and registers ``name``; returns the registered target."""
    label = kind.label
    host = load_plugin(module, label)
    names = host.registry.names(kind)
    if name not in names:
        raise fail(label, "registers its name", f"{module} registers {names or 'no'} {label}s, not {name!r}")
    try:
        return host.registry.get(kind, name)
    except Exception as exc:  # noqa: BLE001
        raise fail(label, "registers its name", f"the registered target does not load: {exc}") from None


def ppo_config(**fields: Any) -> Any:
    """A run config of ``rlhf train ppo``, what ``from_config`` receives: the defaults, with ``fields`` set as a
    YAML config sets them (``ppo_config(plugins={"mine": {"scale": 0.1}}, algo={"kl": {"init_coef": 0.0}})``).
    The result is mutable (``config.ds.zero_stage = 2``)."""

    return PPOConfig(**fields)


def not_collected(method: Callable[..., None]) -> Callable[..., None]:
    """A kit's ``test_contract``, kept for plugins that call it (``super().test_contract(...)``) or call a kit's
    method directly, but not collected: :class:`ContractProperties` reports its properties one test each."""
    method.__test__ = False  # type: ignore[attr-defined]
    return method


class ContractProperties:
    """Mixin of a kit whose ``test_contract`` checks its contract in one pass: pytest shows one test per property,
    ``test_property[<property>]``. The contract runs once per kit class (on the first property's fixtures), a
    broken property is recorded and the rest still checked; a property the pass never reached fails as not checked.

    ``contract_properties`` lists the properties in the order the contract checks them (a check that stops the
    pass, such as a component that cannot be built, fails that property and leaves the later ones unchecked)."""

    contract_properties: ClassVar[tuple[str, ...]] = ()

    def properties(self) -> tuple[str, ...]:
        """The properties of this component's contract (override where its traits add some)."""
        return self.contract_properties

    def pytest_generate_tests(self, metafunc: Any) -> None:
        if metafunc.function.__name__ == "test_property":
            metafunc.parametrize("contract_property", self.properties())

    def test_property(self, contract_property: str, request: Any) -> None:
        recorded, stop = self._contract_run(request)
        declared = self.properties()
        if recorded.get(contract_property) is not None:
            raise recorded[contract_property]
        if contract_property in recorded or stop is None:
            return  # checked and held (a property checked directly has no record unless it failed)
        stopped_at = getattr(stop, "prop", None)
        if stopped_at == contract_property:
            raise stop
        if stopped_at in declared and declared.index(contract_property) < declared.index(stopped_at):
            return  # checked before the pass stopped
        raise AssertionError(f"{contract_property}: not checked, the contract stopped first: {stop}") from stop

    def _contract_run(self, request: Any) -> tuple[dict[str, ConformanceFailure | None], BaseException | None]:
        kit = type(self)
        if "_contract_outcome" not in kit.__dict__:
            fixtures = {name: request.getfixturevalue(name) for name in inspect.signature(self.test_contract).parameters}
            recorded: dict[str, ConformanceFailure | None] = {}
            token = _recorded.set(recorded)
            stop = None
            try:
                self.test_contract(**fixtures)  # type: ignore[attr-defined]
            except Exception as exc:  # noqa: BLE001 - reported by the properties it leaves unchecked
                stop = exc
            finally:
                _recorded.reset(token)
            kit._contract_outcome = (recorded, stop)  # type: ignore[attr-defined]
        return kit.__dict__["_contract_outcome"]


class ComponentKit:
    """Base of the pytest kits: subclass one (``class TestMine(AdvantageEstimatorKit)``) and set

    * ``component`` — the registered class (built like the runtime does, through ``from_config``),
      function or instance; or override :meth:`make_component` to build it with chosen options;
    * ``plugin_module`` — the dotted module with the ``@rlhf.hookimpl`` functions;
    * ``registered_name`` — the name it registers (checked through a real plugin host).
    """

    kind: ClassVar[ComponentKind]
    component: ClassVar[Any] = None
    plugin_module: ClassVar[str | None] = None
    registered_name: ClassVar[str | None] = None

    def run_config(self) -> Any:
        """The config handed to ``from_config``; override to set flags or plugin options."""
        return ppo_config()

    def make_component(self) -> Any:
        if self.component is None:
            raise fail(self.kind.label, "kit set-up", f"set {type(self).__name__}.component or override make_component()")
        return build(self.component, self.run_config())

    def _module(self) -> str:
        if not self.plugin_module:
            raise fail(self.kind.label, "kit set-up", f"set {type(self).__name__}.plugin_module to the module with the hooks")
        return self.plugin_module

    def test_import_is_light(self) -> None:
        check_import_is_light(self.kind.label, self._module())

    def test_registers_its_name(self) -> None:
        if not self.registered_name:
            raise fail(self.kind.label, "kit set-up", f"set {type(self).__name__}.registered_name to the name it registers")
        check_registers(self.kind, self._module(), self.registered_name)

    def test_picklable(self) -> None:
        check_picklable(self.kind.label, self.make_component())
