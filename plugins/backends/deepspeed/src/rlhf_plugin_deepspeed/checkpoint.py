"""Loading a DeepSpeed training checkpoint into an engine, with every failure as one clear error."""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

from rlhf.errors import CHECKPOINT_WAY_OUT, CheckpointError


def load_engine(engine: Any, directory: Path, tag: str, *, universal: bool = False) -> None:
    """Load the DeepSpeed states under ``directory/tag`` (model, optimizer, scheduler) into ``engine``;
    ``universal`` (``--ds.use_universal_ckpt``): through DeepSpeed's universal form, on any number of ranks.

    Every way this fails is a :class:`CheckpointError` naming the states dir and what to do:
    a missing dir (DeepSpeed would return ``(None, None)`` and train on from the initial weights),
    a missing, truncated or corrupt file, or the states of a model of another size.
    """
    states = directory / tag
    if not any(states.glob("*model_states.pt")):
        raise CheckpointError(f"checkpoint {states} holds no DeepSpeed model states (a damaged checkpoint, or one saved "
                              f"with --ckpt.disable_ds); delete {directory} {CHECKPOINT_WAY_OUT}")
    try:
        if universal:
            from rlhf_plugin_deepspeed.universal import convert

            tag = convert(directory, tag)
        loaded, _ = engine.load_checkpoint(str(directory), tag=tag, load_optimizer_states=True,
                                           load_lr_scheduler_states=True)
    except Exception as exc:  # noqa: BLE001 - whatever DeepSpeed or torch.load raise here is about these files
        raise CheckpointError(f"checkpoint {states} cannot be loaded: {_load_failure(exc, directory)}") from exc
    if loaded is None:
        raise CheckpointError(f"checkpoint {states} cannot be loaded: DeepSpeed found no states; "
                              f"delete {directory} {CHECKPOINT_WAY_OUT}")


_SIZE_MISMATCH = re.compile(r"size mismatch for (\S+): copying a param with shape torch.Size\((\[.*?\])\) from checkpoint, "
                            r"the shape in current model is torch.Size\((\[.*?\])\)")


def _load_failure(exc: BaseException, directory: Path) -> str:
    """Why DeepSpeed could not load the checkpoint in ``directory``, and what to do, in a few words."""
    if isinstance(exc, FileNotFoundError):
        return f"{exc.filename} is missing; delete {directory} {CHECKPOINT_WAY_OUT}"
    mismatch = _SIZE_MISMATCH.search(str(exc))
    if mismatch:
        name, saved, current = mismatch.groups()
        return (f"it holds a model of another size ({name} is {saved} there, {current} in the model being trained); "
                f"resume with the model it was trained from, or drop --ckpt.load_enable")
    detail = str(exc).strip().split("\n")[0].split(". ")[0][:200]
    unreadable = "PytorchStreamReader" in detail or isinstance(exc, (EOFError, pickle.UnpicklingError))
    verdict = "a file is truncated or corrupt" if unreadable else "it is damaged or does not fit this run"
    return f"{type(exc).__name__}: {detail}; {verdict}: delete {directory} {CHECKPOINT_WAY_OUT}"
