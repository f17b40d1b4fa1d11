"""``save_state`` / ``load_state``: a training run's adapter and AdamW state on disk, so that a run resumes after
the server restarts.

A checkpoint is addressed as Tinker addresses one, ``tinker://MODEL_ID/weights/NAME``, and lives in
``CHECKPOINT_DIR/MODEL_ID/weights/NAME/`` (``--checkpoint-dir``):

- ``state.json``: the format version, the base model's name and path, and the adapter's LoRA shape;
- ``adapter.pt``: the adapter's tensors, keyed by their module path with the adapter's name as ``{adapter}``;
- ``optimizer.pt``: the AdamW ``state_dict``, its parameters in the adapter's parameter order.

A checkpoint is written into a sibling directory and renamed into place, so a crash leaves none half written.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlhf_plugin_tinker_server.models import LoraShape

FORMAT = 1
SCHEME = "tinker://"
ADAPTER_SLOT = "{adapter}"


class CheckpointError(ValueError):
    """A checkpoint path that names nothing this server can load, or a save it refuses; the message names the field."""


@dataclass
class RunState:
    """What a checkpoint holds, read back: the base model it was trained on, the adapter's shape and tensors, and the
    optimizer state (None when not asked for)."""

    base_model: str
    shape: LoraShape
    adapter: dict[str, Any]
    optimizer: dict[str, Any] | None


def tinker_path(model_id: str, name: str) -> str:
    return f"{SCHEME}{model_id}/weights/{name}"


def _directory(root: Path, path: str) -> Path:
    """Where ``tinker://MODEL_ID/weights/NAME`` lives under ``root``; a path of another shape is refused."""
    parts = path.removeprefix(SCHEME).split("/") if path.startswith(SCHEME) else []
    if len(parts) != 3 or parts[1] != "weights" or not all(parts) or any(p in (".", "..") for p in parts):
        raise CheckpointError(
            f"path {path!r}: a training checkpoint path is tinker://MODEL_ID/weights/NAME (what save_state returned)"
        )
    return root / parts[0] / "weights" / parts[2]


def save_run_state(
    root: Path,
    model_id: str,
    name: str,
    *,
    base_model: str,
    shape: LoraShape,
    adapter: str,
    parameters: dict[str, Any],
    optimizer: Any,
    overwrite: bool,
) -> str:
    """Write the run's checkpoint ``name``; the tinker path it is loaded back from."""
    import torch

    if not name or "/" in name or name in (".", ".."):
        raise CheckpointError(f"path {name!r}: a checkpoint name is one path segment, e.g. 'step-100'")
    path = tinker_path(model_id, name)
    target = _directory(root, path)
    if target.exists() and not overwrite:
        raise CheckpointError(
            f"path {name!r}: run {model_id} already has a checkpoint of that name; save_state(name, overwrite=True) replaces it"
        )
    staging = target.with_name(f".{name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    tensors = {key.replace(f".{adapter}.", f".{ADAPTER_SLOT}."): param.detach().cpu() for key, param in parameters.items()}
    torch.save(tensors, staging / "adapter.pt")
    torch.save(optimizer.state_dict(), staging / "optimizer.pt")
    lora = {
        "rank": shape.rank,
        "train_attn": shape.train_attn,
        "train_mlp": shape.train_mlp,
        "train_unembed": shape.train_unembed,
    }
    (staging / "state.json").write_text(json.dumps({"format": FORMAT, "base_model": base_model, "lora": lora}))
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)
    return path


def read_run_state(root: Path, path: str, *, with_optimizer: bool) -> RunState:
    """The checkpoint at ``path``, its optimizer state only when ``with_optimizer``."""
    import torch

    directory = _directory(root, path)
    if not (directory / "state.json").is_file():
        raise CheckpointError(f"path {path!r}: no checkpoint there on this server (under {root})")
    meta = json.loads((directory / "state.json").read_text())
    if meta.get("format") != FORMAT:
        raise CheckpointError(f"path {path!r}: checkpoint format {meta.get('format')}; this server reads {FORMAT}")
    optimizer = torch.load(directory / "optimizer.pt", weights_only=True) if with_optimizer else None
    return RunState(
        meta["base_model"], LoraShape(**meta["lora"]), torch.load(directory / "adapter.pt", weights_only=True), optimizer
    )


def load_into(state: RunState, adapter: str, parameters: dict[str, Any], optimizer: Any) -> None:
    """Copy a checkpoint's tensors into the adapter ``adapter`` (and its optimizer state, when read)."""
    import torch

    with torch.no_grad():
        for key, tensor in state.adapter.items():
            parameters[key.replace(f".{ADAPTER_SLOT}.", f".{adapter}.")].copy_(tensor)
    if state.optimizer is not None:
        optimizer.load_state_dict(state.optimizer)
