"""The optional ``rlhf plan`` answers of a component (docs/plan.md), checked where the component has them: a
list of :class:`rlhf.planning.MemoryPart` whose bytes are counts (or None, "not estimated"), phases that exist, and
model states that shrink, never grow, when split over more ranks."""

from __future__ import annotations

from typing import Any

from rlhf.planning import MemoryPart, ModelShape, PlannedModel
from rlhf.planning.parts import PHASES
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
