"""A rollout engine or training backend the library underneath refuses, told apart from a bug.

While a systems component is built and first used (an engine's construction and first generate or weight
load, a backend's distributed set-up, model loads and first step), the library it wraps (vLLM, DeepSpeed,
torch, transformers) may refuse what the run gave it: a model or config it cannot serve, a dtype the
device lacks, memory that runs out. rlhf has no bug then, and the user has a choice to make. So the core
runs those calls inside :func:`library_refusals`: an exception raised inside a library (the deepest frame
of its traceback that is neither the standard library, rlhf, nor the component's own package) becomes a
:class:`rlhf.errors.ComponentRefusedError` naming the component, its distribution, the library's own message
and a way out: the component's optional ``error_hint(exc) -> str | None`` classmethod, else the selection flag
and the other installed components. It is raised in the process where the exception happened, because
Ray carries the exception across but not its traceback. An exception raised by rlhf's or the component's own
code, or after the first use, stays what it is (an internal error unless it is a user error).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from rlhf.errors import ComponentRefusedError, UserError, one_line

#: The plugin API (docs/plugin-api.md): for a trainer outside the core that builds a backend or an engine itself.
__all__ = ["ComponentLabel", "FirstUse", "library_refusals"]


@dataclass(frozen=True)
class ComponentLabel:
    """How the user-facing line names a selected component (pickled to the process that runs it)."""

    #: the kind in words: ``"rollout engine"``, ``"training backend"``
    kind: str
    #: the name it was selected by (``--rollout.engine vllm``)
    name: str
    #: the flag that selects another one
    flag: str
    #: the other installed components of this kind, for the way out
    others: tuple[str, ...] = ()

    @classmethod
    def among(cls, kind: str, name: str, flag: str, installed: list[str]) -> ComponentLabel:
        """The label of ``name``, with the rest of ``installed`` (the registry's names of its kind) as the others."""
        return cls(kind, name, flag, tuple(sorted(n for n in installed if n != name)))

    def describe(self, component: type) -> str:
        """``rollout engine 'vllm' (rlhf-plugin-vllm)``; a component outside any distribution goes without one."""
        distribution = _distribution(component)
        return f"{self.kind} {self.name!r}" + (f" ({distribution})" if distribution else "")

    def way_out(self) -> str:
        if not self.others:
            return f"choose another {self.kind} with {self.flag} (none other is installed)"
        return f"choose another {self.kind}: {self.flag} {' | '.join(self.others)}"


def _distribution(component: type) -> str | None:
    import importlib.metadata

    names = importlib.metadata.packages_distributions().get(_package(component.__module__), [])
    return names[0] if names else None


def _package(module_name: str) -> str:
    return module_name.split(".", 1)[0]


#: Libraries that only check their caller's data: what they raise (a pydantic ``ValidationError`` of a plugin's own
#: options model) is the caller's finding, so it is blamed on the frame that called them.
CHECKING_LIBRARIES = frozenset({"pydantic", "pydantic_core"})


def raised_by_library(exc: BaseException, component: type, callers: tuple[str, ...] = ()) -> bool:
    """Whether ``exc`` was raised inside a library the component calls, not by rlhf's, the component's or its
    ``callers``' (packages) own code: its type is a library's, or the deepest frame of its traceback outside the
    standard library is in none of those packages. A checking library (:data:`CHECKING_LIBRARIES`) counts as the
    code that called it: a plugin validating its options with pydantic raised that error itself, while vLLM
    validating its engine config with pydantic is vLLM refusing."""
    own = {"rlhf", _package(component.__module__), *callers}
    passed_over = {*own, "builtins", *sys.stdlib_module_names, *CHECKING_LIBRARIES}
    if _package(type(exc).__module__) not in passed_over:
        return True  # a library's own exception type (torch.OutOfMemoryError), even when raised from C code
    origin = None
    frame = exc.__traceback__
    while frame is not None:
        package = _package(frame.tb_frame.f_globals.get("__name__", ""))
        if package and package not in sys.stdlib_module_names and package not in CHECKING_LIBRARIES:
            origin = package
        frame = frame.tb_next
    return origin is not None and origin not in own


def refusal(exc: BaseException, label: ComponentLabel, component: type, during: str) -> ComponentRefusedError:
    """The one-line error for a library's refusal ``exc`` while ``during`` (``"at its first generate"``)."""
    hint_of = getattr(component, "error_hint", None)
    hint = hint_of(exc) if hint_of is not None else None
    message = one_line(str(exc)).rstrip(".") or "(no message)"
    return ComponentRefusedError(
        f"{label.describe(component)} cannot serve this run: {during}, the library under it raised "
        f"{type(exc).__name__}: {message}; {hint or label.way_out()}")


@contextlib.contextmanager
def library_refusals(label: ComponentLabel, component: type, during: str, callers: tuple[str, ...] = ()) -> Iterator[None]:
    """Around a set-up or first-use call of ``component`` (its class): a library's refusal becomes
    :func:`refusal`; anything else (a user error, a bug in rlhf, the component or the ``callers``, the packages
    of a trainer outside the core that makes the call) passes unchanged."""
    try:
        yield
    except UserError:
        raise
    except Exception as exc:
        if not raised_by_library(exc, component, callers):
            raise
        raise refusal(exc, label, component, during) from exc


class FirstUse:
    """Which methods of one component have run once: only their first call is watched for refusals."""

    def __init__(self, label: ComponentLabel, component: type, callers: tuple[str, ...] = ()) -> None:
        """``callers``: the packages of a trainer outside the core that calls the component (``("rlhf_supervised",)``):
        what their code raises is a bug too, not the library's refusal."""
        self.label, self.component, self.callers = label, component, callers
        self.used: set[str] = set()

    def watch(self, method: str, during: str | None = None) -> Any:
        """:func:`library_refusals` around the first call of ``method`` (``during``: how the line says when, default
        ``"at its first <method>"``); a no-op context afterwards."""
        if method in self.used:
            return contextlib.nullcontext()
        self.used.add(method)
        return library_refusals(self.label, self.component, during or f"at its first {method}", self.callers)
