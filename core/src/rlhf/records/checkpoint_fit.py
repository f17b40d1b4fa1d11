"""What wrote a checkpoint's training states, and whether they fit the run that resumes from them.

A checkpoint's ``state.json`` has ``models``: for every trained model group (``actor``, ``critic``, a supervised
trainer's ``model``) the record :func:`rlhf.config.training_backend.model_record` makes when it is saved::

    {"backend": "deepspeed", "world_size": 2, "layout": {"zero_stage": 3, "tensor_parallel_size": 1},
     "lora_rank": 0, "ema": false, "model": "/models/base", "states": true}

``layout`` is what the training backend's optional ``checkpoint_layout(config)`` says about how it splits a model
(docs/plugins/training-backend.md); ``states`` is false under ``--ckpt.disable_ds`` (no training states were
written). :func:`check_fit` compares those records with the resuming run's before anything loads, so a checkpoint
that is intact but was written by another backend, or with a LoRA adapter where the run trains the full model, is
refused with why and the flag that fits it, never as "damaged". Another number of ranks is not a refusal: the
backend converts the states (the returned notes say so). Checkpoints written before these records existed have
no ``models``; for them the backends' own load errors are all there is.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlhf.errors import CheckpointError

#: The plugin API (docs/plugin-api.md); the module's other names may change in any release.
__all__ = ["check_fit"]


def check_fit(directory: Path, state: dict[str, Any], current: dict[str, dict[str, Any]],
              converts: Callable[[str], bool] | None = None) -> list[str]:
    """Refuse a checkpoint whose training states cannot resume the run whose groups ``current`` records (as
    :func:`rlhf.config.training_backend.model_record` makes them): a :class:`CheckpointError` that says why and what fits. Returns one note per
    group that resumes on another number of ranks or another layout (the backend converts those), or from another
    backend that ``converts(backend)`` says this run converts from (:func:`rlhf.config.training_backend.converts_from`)."""
    saved = state.get("models")
    if not isinstance(saved, dict):
        return []  # written before the records: the backend's load is the check
    notes = []
    for role, now in current.items():
        then = saved.get(role)
        if then is None:
            raise CheckpointError(f"checkpoint {directory} holds no {role}: the run that wrote it trained "
                                  f"{', '.join(sorted(saved)) or 'nothing'}; resume with the algorithm it was written "
                                  f"with (its flags: rlhf checkpoint inspect {directory}), or drop --ckpt.load_enable")
        if not then.get("states", True):
            raise CheckpointError(f"checkpoint {directory} has no training states (it was written with "
                                  f"--ckpt.disable_ds), so no run can resume from it; start a new run from its hf/ "
                                  f"model, or drop --ckpt.load_enable")
        moved = then.get("backend") != now["backend"]
        if moved and not (converts is not None and converts(str(then.get("backend")))):
            raise CheckpointError(f"checkpoint {directory} was written by --train.backend {then.get('backend')} and this "
                                  f"run uses {now['backend']}, which cannot load it (a backend resumes another's "
                                  f"checkpoint when that one exports and this one loads the backend-neutral full state: "
                                  f"docs/plugins/training-backend.md): resume it with --train.backend "
                                  f"{then.get('backend')}, or start a new run from its weights (rlhf checkpoint export "
                                  f"{directory} --model {role} --out DIR)")
        if then.get("lora_rank", 0) != now["lora_rank"]:
            def kind(rank: int) -> str:
                return f"a LoRA adapter of rank {rank}" if rank else "the full model"
            raise CheckpointError(f"checkpoint {directory} trained {kind(then.get('lora_rank', 0))} of the {role} and "
                                  f"this run trains {kind(now['lora_rank'])}: resume with --ds.lora.rank "
                                  f"{then.get('lora_rank', 0)}, or start a new run from its weights (rlhf checkpoint "
                                  f"export {directory} --model {role} --out DIR)")
        changes = [f"{then.get('world_size')} ranks -> {now['world_size']}"] if then.get("world_size") != now["world_size"] else []
        if moved:  # one backend's layout says nothing of another's
            changes.append(f"--train.backend {then.get('backend')} -> {now['backend']}")
        else:
            changes += [f"{key} {then.get('layout', {}).get(key)} -> {value}" for key, value in now["layout"].items()
                        if then.get("layout", {}).get(key, value) != value]
        if changes:
            notes.append(f"{role}: {', '.join(changes)}")
    return notes
