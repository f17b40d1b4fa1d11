"""Training checkpoints of an FSDP2 model through ``torch.distributed.checkpoint`` (DCP), for an exact resume.

``directory/tag`` holds DCP's files (each rank writes its shards of the weights and optimizer states;
rank 0 then writes ``.metadata`` through a temporary name, so a checkpoint without it is incomplete) and
``trainer_state.pt`` (the LR scheduler and the micro-step counter, which every rank holds alike).
Loading needs the same model; DCP reshards it onto another number of ranks as it loads (each rank reads the
pieces of its new shards from every saved one), so a resume on another world size needs no conversion.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from rlhf.errors import CHECKPOINT_WAY_OUT, CheckpointError

TRAINER_STATE = "trainer_state.pt"


def save_states(module: Any, optimizer: Any, extra: dict[str, Any], directory: Path, tag: str) -> None:
    """Every rank: the model and optimizer shards, and ``extra`` (the same on every rank) from rank 0."""
    from torch.distributed.checkpoint.state_dict import get_state_dict

    path = directory / tag
    path.mkdir(parents=True, exist_ok=True)
    model_state, optimizer_state = get_state_dict(module, optimizer)
    dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(path))
    if dist.get_rank() == 0:
        torch.save(extra, path / TRAINER_STATE)
    dist.barrier()  # the caller commits the staging dir once every rank returns


def load_states(module: Any, optimizer: Any, directory: Path, tag: str) -> dict[str, Any]:
    """Every rank: load what :func:`save_states` wrote into ``module`` and ``optimizer``; returns ``extra``.

    A missing, incomplete, corrupt or mismatched checkpoint is a :class:`CheckpointError` naming the dir
    and what to do (DCP raises on every rank alike, so no rank is left waiting in a collective)."""
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    path = directory / tag
    missing = [name for name in (".metadata", TRAINER_STATE) if not (path / name).is_file()]
    if missing and path.is_dir() and any(path.glob("*model_states.pt")):
        raise CheckpointError(f"checkpoint {path} was written by --train.backend deepspeed, not fsdp2: resume it with "
                              "--train.backend deepspeed")
    if missing and not path.exists():
        raise CheckpointError(f"checkpoint {directory} has no {path.name}/: written with --ckpt.disable_ds or by a run "
                              f"without this model (rlhf checkpoint inspect {directory} says what it holds), or damaged "
                              f"(a folder deleted from it): only then delete {directory} {CHECKPOINT_WAY_OUT}")
    if missing:
        raise CheckpointError(f"checkpoint {path} holds no complete FSDP2 states ({', '.join(missing)} missing), so it is "
                              f"damaged; delete {directory} {CHECKPOINT_WAY_OUT}")
    try:
        model_state, optimizer_state = get_state_dict(module, optimizer)
        states = {"model": model_state, "optimizer": optimizer_state}
        dcp.load(states, checkpoint_id=str(path))
        set_state_dict(module, optimizer, model_state_dict=states["model"], optim_state_dict=states["optimizer"])
        return torch.load(path / TRAINER_STATE, weights_only=True)
    except (Exception, dcp.CheckpointException) as exc:  # noqa: BLE001 - whatever DCP or torch.load raise is about these files
        cause = _first_cause(exc)
        detail = str(cause).strip().split("\n")[0][:200]
        if isinstance(cause, FileNotFoundError):  # a file .metadata lists is gone
            raise CheckpointError(f"checkpoint {path} is damaged ({detail}); delete {directory} {CHECKPOINT_WAY_OUT}") from exc
        raise CheckpointError(f"checkpoint {path} cannot be loaded ({type(cause).__name__}: {detail}): it does not fit "
                              f"this model, or it is damaged: rlhf checkpoint inspect {directory} says whether it is "
                              f"complete and which flags wrote it (resume with those); only if it is damaged, delete "
                              f"{directory} {CHECKPOINT_WAY_OUT}") from exc


def full_state(directory: Path, tag: str) -> dict[str, Any]:
    """The whole model weights :func:`save_states` wrote, by their names, read in this process (no process group;
    DCP joins every rank's shards)."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    path = directory / tag
    if not (path / ".metadata").is_file():
        raise CheckpointError(f"checkpoint {path} holds no FSDP2 states (no .metadata): written by another "
                              "--train.backend, or damaged; rlhf checkpoint inspect says which")
    return dict(_load_state_dict_from_keys({"model"}, checkpoint_id=str(path))["model"])


def optimizer_state(directory: Path, tag: str) -> dict[str, Any]:
    """The optimizer's states :func:`save_states` wrote, whole, by parameter name in torch's keys, and the optimizer
    steps taken (the LR scheduler's count), read in this process (no process group)."""
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    path = directory / tag
    if not (path / ".metadata").is_file() or not (path / TRAINER_STATE).is_file():
        raise CheckpointError(f"checkpoint {path} holds no complete FSDP2 states: written by another --train.backend, "
                              "or damaged; rlhf checkpoint inspect says which")
    saved = _load_state_dict_from_keys({"optimizer"}, checkpoint_id=str(path))["optimizer"]["state"]
    steps = torch.load(path / TRAINER_STATE, weights_only=True)["lr_scheduler"]["last_epoch"]
    return {"state": {name: {key: value for key, value in per.items() if key != "step"} for name, per in saved.items()},
            "steps": int(steps)}


def load_full(module: Any, optimizer: Any, weights: dict[str, Any], optimizer_state: dict[str, dict[str, Any]],
              steps: int) -> None:
    """Every rank: whole weights and per-parameter optimizer states by name (another backend's checkpoint, through
    the backend-neutral full state) into the sharded ``module`` and its ``optimizer``; each rank keeps its shards.
    A state the size of its parameter is sharded like it; ``step`` (AdamW's) is ``steps`` on every parameter."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
    from torch.distributed.tensor import DTensor, distribute_tensor

    module_names = set(module.state_dict())
    weights = {name: tensor for name, tensor in weights.items() if name in module_names}
    set_model_state_dict(module, weights, options=StateDictOptions(full_state_dict=True))

    def like(value: Any, param: Any) -> Any:
        value = value.to(param.dtype)
        if isinstance(param, DTensor):  # sharded on the mesh's device, then kept where the shard is (the CPU, offloaded)
            return distribute_tensor(value.to(param.device), param.device_mesh, param.placements).to(param.device)
        return value.to(param.device)

    parameters = dict(module.named_parameters())
    missing = sorted(set(optimizer_state) - set(parameters))
    if missing:
        raise CheckpointError(f"the checkpoint's optimizer states name parameters this model lacks ({missing[0]}, "
                              f"{len(missing)} in all): it was written for another model")
    stepped = [p for group in optimizer.param_groups for p in group["params"]]
    with torch.no_grad():
        for name, per in optimizer_state.items():
            param = parameters[name]
            state = {key: like(value, param) for key, value in per.items()}
            if any(p is param for p in stepped) and "exp_avg" in state:  # torch's Adam family counts steps per parameter
                state["step"] = torch.tensor(float(steps))
            optimizer.state[param] = state


def _first_cause(exc: BaseException) -> BaseException:
    """DCP's ``CheckpointException`` (a ``BaseException``, raised on every rank alike) wraps each failing rank's
    error, and its own message is a list of tracebacks: the lowest failing rank's error tells what went wrong."""
    failures = getattr(exc, "failures", None)
    if isinstance(exc, dcp.CheckpointException) and failures:
        return failures[min(failures)][0]
    return exc
