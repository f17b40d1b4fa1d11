"""The optional ``rlhf plan`` answers of a component (docs/plan.md), checked where the component has them: a
list of :class:`rlhf.planning.MemoryPart` whose bytes are counts (or None, "not estimated"), phases that exist, and
model states that shrink, never grow, when split over more ranks; remedies that apply to the config and free what
they say."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlhf.planning import REMEDY_COSTS, MemoryPart, ModelShape, PlannedModel, Remedy, RemedyContext
from rlhf.planning.parts import PHASES
from rlhf.runtime.plan.remedies import changed_config
from rlhf.testing.conformance._core import fail

#: a Llama-7B-like shape, so that parts are far from zero
SHAPE = ModelShape("tiny", 6_738_415_616, 131_072_000, 32, 4096, 11008, 32, 32, 128, 32000, 131_072_000,
                   6_476_005_376, {"q_proj": 32 * 8192})


def _check_parts(kind: str, parts: Any, example: str) -> list[MemoryPart]:
    if not isinstance(parts, list) or not all(isinstance(p, MemoryPart) for p in parts):
        raise fail(kind, "plan_memory", f"returned {type(parts).__name__}, expected a list of rlhf.planning.MemoryPart",
                   example)
    for part in parts:
        if part.nbytes is not None and (not isinstance(part.nbytes, int) or part.nbytes < 0):
            raise fail(kind, "plan_memory", f"part {part.part!r} has {part.nbytes!r} bytes: a count >= 0 or None", example)
        if not set(part.away_in) <= set(PHASES):
            raise fail(kind, "plan_memory", f"part {part.part!r} is away in {part.away_in}; phases are {PHASES}", example)
    return parts


def _total(parts: list[MemoryPart]) -> int:
    return sum(p.nbytes or 0 for p in parts)


def check_backend_plan(backend_class: type, config: Any) -> None:
    """A training backend's ``plan_memory(config, model)``, if it has one: well-formed parts for a trained and an
    evaluated model, and no more bytes per GPU on 8 ranks than on 1."""
    plan_memory = getattr(backend_class, "plan_memory", None)
    if plan_memory is None:
        return
    totals = []
    for ranks in (1, 8):
        trained = PlannedModel("actor", SHAPE, True, ranks, SHAPE.parameters, 8 * SHAPE.parameters, section=config.actor)
        totals.append(_total(_check_parts("training backend", plan_memory(config, trained), f"trained, {ranks} ranks")))
        frozen = PlannedModel("ref", SHAPE, False, ranks, 0, None, section=config.ref)
        _check_parts("training backend", plan_memory(config, frozen), f"evaluated, {ranks} ranks")
    if totals[1] > totals[0]:
        raise fail("training backend", "plan_memory", f"8 ranks hold more per GPU ({totals[1]} B) than 1 ({totals[0]} B)")


def check_engine_plan(engine_class: type, config: Any) -> None:
    """A rollout engine's ``plan_memory(config, shape, gpu_memory)``, if it has one: well-formed parts on an 80 GiB
    GPU and where the memory is unknown."""
    plan_memory = getattr(engine_class, "plan_memory", None)
    if plan_memory is None:
        return
    for memory in (80 << 30, None):
        _check_parts("rollout engine", plan_memory(config, SHAPE, memory), f"gpu_memory {memory}")


def check_optimizer_plan(factory: Any) -> None:
    """An optimizer's ``plan_state_bytes(shape, trainable)``, if it has one: a count that grows with ``trainable``."""
    state_bytes = getattr(factory, "plan_state_bytes", None)
    if state_bytes is None:
        return
    few, many = state_bytes(SHAPE, 1000), state_bytes(SHAPE, SHAPE.parameters)
    if not isinstance(many, int) or few < 0 or many < few:
        raise fail("optimizer", "plan_state_bytes", f"{few} B for 1000 parameters, {many} B for all: counts that grow")


def check_backend_remedies(backend_class: type, config: Any) -> None:
    """A training backend's ``plan_remedies(config, run)``, if it has one: see :func:`_check_remedies`; the parts a
    remedy frees are checked against its own ``plan_memory`` of a trained model on 8 ranks."""
    def parts(changed: Any) -> list[MemoryPart]:
        trained = PlannedModel("actor", SHAPE, True, 8, SHAPE.parameters, 8 * SHAPE.parameters, section=changed.actor)
        return backend_class.plan_memory(changed, trained)

    _check_remedies("training backend", backend_class, config, RemedyContext({"actor": 8}, 16, 8, None),
                    parts if hasattr(backend_class, "plan_memory") else None)


def check_engine_remedies(engine_class: type, config: Any) -> None:
    """A rollout engine's ``plan_remedies(config, run)``, if it has one: see :func:`_check_remedies`; the parts a
    remedy frees are checked against its own ``plan_memory`` on an 80 GiB GPU."""
    def parts(changed: Any) -> list[MemoryPart]:
        return engine_class.plan_memory(changed, SHAPE, 80 << 30)

    _check_remedies("rollout engine", engine_class, config, RemedyContext({"actor": 8}, 16, 8, engine_class),
                    parts if hasattr(engine_class, "plan_memory") else None)


def _check_remedies(kind: str, component: type, config: Any, run: RemedyContext,
                    parts: Callable[[Any], list[MemoryPart]] | None) -> None:
    """Each remedy offered for a run on 8 of 16 GPUs is a :class:`rlhf.planning.Remedy` of a known kind, with a
    one-line reason and flags that name fields of the config (or a plugin's options); applied, the config still
    validates, and every part it says it frees holds fewer bytes on the GPU in some phase than before."""
    plan_remedies = getattr(component, "plan_remedies", None)
    if plan_remedies is None:
        return
    remedies = plan_remedies(config, run)
    if not isinstance(remedies, list) or not all(isinstance(r, Remedy) for r in remedies):
        raise fail(kind, "plan_remedies", f"returned {type(remedies).__name__}, expected a list of rlhf.planning.Remedy")
    for remedy in remedies:
        typed = remedy.typed()
        if remedy.kind not in REMEDY_COSTS:
            raise fail(kind, "plan_remedies", f"kind {remedy.kind!r} is none of rlhf.planning.REMEDY_COSTS", typed)
        if not remedy.flags or not remedy.reason.strip() or "\n" in remedy.reason:
            raise fail(kind, "plan_remedies", "a remedy needs flags and a one-line reason", typed)
        try:
            changed = changed_config(config, dict(remedy.flags))
        except (KeyError, TypeError, ValueError) as exc:
            raise fail(kind, "plan_remedies", f"its flags do not apply to the run's config ({exc!r})", typed) from None
        if parts is None or not remedy.frees:
            continue
        before, after = parts(config), parts(changed)
        if not any(_held(after, remedy.frees, phase) < _held(before, remedy.frees, phase) for phase in PHASES):
            raise fail(kind, "plan_remedies", f"it says it frees {', '.join(remedy.frees)}, but its plan_memory "
                       "holds as many bytes of them on the GPU in every phase", typed)


def _held(parts: list[MemoryPart], names: tuple[str, ...], phase: str) -> int:
    return sum(p.nbytes or 0 for p in parts if p.part in names and phase not in p.away_in)
