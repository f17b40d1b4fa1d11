"""Checkpoints and model saves that are complete or absent, and resume that never starts fresh by accident.

Layout of ``<ckpt.path>/global_step<N>/``: ``actor/`` (and ``critic/``) DeepSpeed
states (model, optimizer, scheduler), ``state.json`` (step, data position, KL
coefficient, RNG seeds, the plugin set, plugin states), optional ``hf/`` model.

A checkpoint is written into ``.staging-global_step<N>`` and renamed into place with its
``state.json`` last, so a ``global_step<N>`` dir without a readable ``state.json`` is damage,
never a save in progress: resume refuses it rather than silently starting over. A final
model is written into a staging dir inside its output dir and moved into place file by
file. A failed write (full disk, no permission) removes what it staged and leaves as a
:class:`~rlhf.errors.StorageError` naming the path.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rlhf.errors import (
    CHECKPOINT_WAY_OUT,
    STORAGE_ERRNOS,
    CheckpointError,
    RunInterrupted,
    UserError,
    exception_chain,
    storage_error,
)
from rlhf.records.checkpoint_fit import check_fit

PATTERN = re.compile(r"^global_step(\d+)$")
_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)")
#: What the user can do about a checkpoint that cannot be resumed, after "delete <dir>".

log = logging.getLogger("rlhf.checkpoint")

#: The plugin API (docs/plugin-api.md); the module's other names may change in any release.
__all__ = ["interrupted", "resume", "save"]


def write_text_atomically(path: Path, text: str, what: str) -> None:
    """``path`` holds ``text`` whole or keeps what it had: written beside it, then renamed over it. A
    full disk or a missing folder is a :func:`storage_error` naming ``what`` (e.g. "metrics")."""
    fresh = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        fresh.write_text(text)
        os.replace(fresh, path)
    except OSError as exc:
        fresh.unlink(missing_ok=True)
        raise storage_error(path, exc, what) from exc


def checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Every ``global_step<N>`` dir under ``root``, oldest first (staging dirs are not checkpoints)."""
    if not root.is_dir():
        return []
    return sorted((int(m.group(1)), p) for p in root.iterdir() if (m := PATTERN.match(p.name)) and p.is_dir())


# ----------------------------------------------------------------------------- writing


@contextmanager
def _writing(path: Path, what: str) -> Iterator[None]:
    """Run a write under ``path``; when it fails for lack of space or permission, raise a
    :class:`StorageError` naming ``path`` (any other failure passes through unchanged)."""
    try:
        yield
    except UserError:
        raise
    except Exception as exc:
        cause = _storage_cause(path, exc)
        if cause is None:
            raise
        raise storage_error(path, cause, what) from exc


def _storage_cause(path: Path, exc: BaseException) -> OSError | None:
    """The OSError behind a failed write under ``path``, found in this order: an OSError in ``exc``'s
    chain (Ray's wrapped ``cause`` included); an "(os error N)" in a message (how Rust's I/O errors
    reach Python: safetensors reports a full disk so, and removes its partial file); what the
    filesystem answers to a probe write next to ``path``.

    The probe is needed because ``torch.save`` to a path (DeepSpeed's states) reports a full disk as
    a ``RuntimeError`` ("unexpected pos …") with no errno; it runs before the staged files are
    removed, while the disk is as full as the failed write left it.
    """
    for current in exception_chain(exc):
        if isinstance(current, OSError) and current.errno is not None:
            return current if current.errno in STORAGE_ERRNOS else None  # ENOENT & co: a bug, not the disk
        if rust := _RUST_OS_ERROR.search(str(current)):
            code = int(rust.group(1))
            return OSError(code, os.strerror(code)) if code in STORAGE_ERRNOS else None
    existing = next(p for p in (path, *path.parents) if p.is_dir())
    try:
        with tempfile.TemporaryFile(dir=existing) as probe:
            probe.write(b"\0" * (1 << 16))
            probe.flush()
            os.fsync(probe.fileno())
    except OSError as answer:
        return answer if answer.errno in STORAGE_ERRNOS else None
    return None


@contextmanager
def _removed_on_failure(path: Path) -> Iterator[None]:
    try:
        yield
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise


def save(root: Path, step: int, state: dict[str, Any], write: Callable[[Path], None], max_num: int, *,
         max_gb: float = math.inf, rank: int = 0, barrier: Callable[[], None] | None = None) -> Path:
    """``write(staging_dir)`` fills the checkpoint; it appears as ``global_step<step>`` only when complete.
    Then the oldest checkpoints go until at most ``max_num`` (``--ckpt.max_num``) are left and they take at
    most ``max_gb`` GiB (``--ckpt.max_mem``); the new one always stays.

    Under a launcher every rank calls this and writes its share; rank 0 stages and commits, and
    ``barrier`` orders them (none: one process). ``state`` is read after ``write``, which may still fill it in.
    """
    sync = barrier if barrier is not None else (lambda: None)
    final = root / f"global_step{step}"
    staging = root / f".staging-global_step{step}"
    with _removed_on_failure(staging), _writing(final, "checkpoint"):
        if rank == 0:
            root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(staging, ignore_errors=True)  # the leftover of a crashed save
            staging.mkdir()
        sync()
        write(staging)
        sync()
        if rank == 0:
            (staging / "state.json").write_text(json.dumps(state, indent=1))
            if final.exists():
                shutil.rmtree(final)
            staging.rename(final)
            _rotate(root, max_num, max_gb)
        sync()
    return final


def _rotate(root: Path, max_num: int, max_gb: float) -> None:
    found = [path for _, path in checkpoints(root)]
    for old in found[: -max(1, max_num)]:
        shutil.rmtree(old, ignore_errors=True)
    kept = found[-max(1, max_num):]
    sizes = [sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) for path in kept]
    while len(kept) > 1 and sum(sizes) > max_gb * 2**30:  # OpenRLHF's GB are GiB
        shutil.rmtree(kept.pop(0), ignore_errors=True)
        sizes.pop(0)
    if sum(sizes) > max_gb * 2**30:
        log.warning("checkpoint %s alone takes %.3g GiB, more than --ckpt.max_mem %g; kept anyway", kept[0],
                    sizes[0] / 2**30, max_gb)


@contextmanager
def published(output_dir: Path, what: str) -> Iterator[Path]:
    """Yield a staging dir inside ``output_dir`` to write a model into; when the block succeeds its
    files replace their namesakes in ``output_dir`` one by one (each rename is atomic, so no file
    is ever half-written under its final name). A failure removes the staging dir; a full disk or
    an unwritable dir is a :class:`StorageError` naming ``output_dir``."""
    staging = output_dir / f".staging-{what}-{os.getpid()}"
    with _removed_on_failure(staging), _writing(output_dir, what):
        output_dir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
        yield staging
        for item in sorted(staging.iterdir()):
            os.replace(item, output_dir / item.name)
        staging.rmdir()


# ----------------------------------------------------------------------------- resuming


def resume(root: Path, load: Callable[[Path, dict[str, Any]], None], keys: tuple[str, ...] = (),
           models: dict[str, dict[str, Any]] | None = None,
           converts: Callable[[str], bool] | None = None) -> dict[str, Any] | None:
    """``--ckpt.load_enable``: ``load(directory, state)`` the latest checkpoint under ``root`` and return its
    state (which has ``step`` and ``keys``), or ``None`` when there is none. Either way a WARNING says which,
    so a resume is never silent. ``models``: this run's trained groups (:func:`rlhf.config.training_backend.model_record`),
    checked against the checkpoint's before ``load`` (:func:`~rlhf.records.checkpoint_fit.check_fit`, with ``converts``:
    which other backends' checkpoints this run converts)."""
    found = checkpoints(root)
    if not found:
        log.warning("--ckpt.load_enable: no checkpoint under %s; starting from step 0", root)
        return None
    _, directory = found[-1]
    state = load_state(directory, keys)
    for note in check_fit(directory, state, models or {}, converts):
        log.warning("--ckpt.load_enable: %s was written by another allocation (%s); the training backend converts it "
                    "or says why it cannot", directory, note)
    load(directory, state)
    log.warning("--ckpt.load_enable: resumed from %s (step %d)", directory, state["step"])
    return state


def interrupted(root: Path) -> RunInterrupted:
    """What a run stopped by Ctrl-C or SIGTERM tells the user: the checkpoint under ``root`` (``--ckpt.path``)
    that ``--ckpt.load_enable`` would resume from, or that there is none."""
    found = checkpoints(root)
    if not found:
        return RunInterrupted(f"no checkpoint was written under {root}, so a new run starts from step 0 "
                              "(--ckpt.save_steps N writes one every N steps)")
    step, directory = found[-1]
    return RunInterrupted(f"the last checkpoint is step {step} ({directory}): {how_to_resume(directory)}")


def resume_advice(root: Path) -> str:
    """Where a run that failed (a worker died) goes on from: the checkpoint under ``root`` that
    ``--ckpt.load_enable`` would resume from, or that it would start from step 0."""
    found = checkpoints(root)
    if not found:
        return (f"no checkpoint was written under {root}, so --ckpt.load_enable would start from step 0 "
                "(--ckpt.save_steps N writes one every N steps)")
    step, directory = found[-1]
    if not resumable(directory):
        return f"the last checkpoint, step {step} ({directory}), {how_to_resume(directory)}"
    return f"resume from step {step} ({directory}) with the same command and --ckpt.load_enable"


def resumable(directory: Path) -> bool:
    """Whether the checkpoint holds the training states a resume loads: not one written with ``--ckpt.disable_ds``
    (its ``state.json`` records each trained group's ``states``; a checkpoint from before the records is taken as
    resumable, and its backend's load is the check)."""
    try:
        models = json.loads((Path(directory) / "state.json").read_text()).get("models")
    except (OSError, ValueError, AttributeError):
        return True
    return not isinstance(models, dict) or all(record.get("states", True) for record in models.values())


def how_to_resume(directory: Path) -> str:
    """The end of every line that tells how to go on from the checkpoint ``directory`` (a preemption, an interrupt,
    a failed worker): the resume command, or, for a checkpoint without training states, that none can resume from it."""
    if resumable(directory):
        return "resume with the same command and --ckpt.load_enable"
    return ("it holds no training states (--ckpt.disable_ds), so no run can resume from it: its hf/ model (with "
            "--ckpt.save_hf) is what the run keeps; drop --ckpt.disable_ds to write checkpoints a run resumes from")


def load_state(directory: Path, keys: tuple[str, ...] = ()) -> dict[str, Any]:
    """The checkpoint's ``state.json``, with an integer ``step`` and ``keys``; a missing, unreadable or
    incomplete one is a :class:`CheckpointError`."""
    path = directory / "state.json"
    if not path.exists():
        raise CheckpointError(f"checkpoint {directory} has no state.json, so it is incomplete or damaged; "
                              f"delete {directory} {CHECKPOINT_WAY_OUT}")
    try:
        state = json.loads(path.read_text())
        if not isinstance(state, dict) or not isinstance(state.get("step"), int):
            raise ValueError("no integer 'step'")
        missing = [key for key in keys if key not in state]
        if missing:
            raise ValueError(f"no {', '.join(missing)}")
    except (OSError, ValueError) as exc:  # ValueError: bad JSON, bad bytes, a missing key
        raise CheckpointError(f"checkpoint {path} is unreadable ({exc}); delete {directory} {CHECKPOINT_WAY_OUT}") from exc
    return state
