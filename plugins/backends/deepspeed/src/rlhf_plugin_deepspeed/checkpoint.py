"""Loading a DeepSpeed training checkpoint into an engine, with every failure as one clear error."""

from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any

from rlhf.errors import CHECKPOINT_WAY_OUT, CheckpointError


def load_engine(engine: Any, directory: Path, tag: str, *, universal: bool = False) -> None:
    """Load the DeepSpeed states under ``directory/tag`` (model, optimizer, scheduler) into ``engine``;
    through DeepSpeed's universal form (converted once) when ``universal`` (``--ds.use_universal_ckpt``) or
    when the states were written by another number of data-parallel ranks than ``engine`` has.

    Every way this fails is a :class:`CheckpointError` naming the states dir and what to do:
    a missing dir (DeepSpeed would return ``(None, None)`` and train on from the initial weights),
    a missing, truncated or corrupt file, or the states of a model of another size.
    """
    states = directory / tag
    if not any(states.glob("*model_states.pt")):
        raise CheckpointError(f"checkpoint {states} holds no DeepSpeed model states: {_what_is_there(states, directory)}")
    saved_ranks, ranks = saved_data_parallel_ranks(states), getattr(engine, "seq_dp_world_size", engine.dp_world_size)
    resharded = saved_ranks not in (None, ranks)
    try:
        if universal or resharded:
            from rlhf_plugin_deepspeed.universal import convert

            tag = convert(directory, tag, f"written by {saved_ranks} data-parallel ranks, loaded by {ranks}"
                          if resharded else "--ds.use_universal_ckpt")
        engine._config.load_universal_checkpoint = universal or resharded  # read at load time only
        loaded, _ = engine.load_checkpoint(str(directory), tag=tag, load_optimizer_states=True,
                                           load_lr_scheduler_states=True)
    except Exception as exc:  # noqa: BLE001 - whatever DeepSpeed or torch.load raise here is about these files
        raise CheckpointError(f"checkpoint {states} cannot be loaded: {_load_failure(exc, directory)}") from exc
    if loaded is None:
        raise CheckpointError(f"checkpoint {states} cannot be loaded: DeepSpeed found no states; "
                              f"delete {directory} {CHECKPOINT_WAY_OUT}")


_OPTIMIZER_SHARD = re.compile(r"zero_pp_rank_(\d+)_mp_rank_\d+_optim_states\.pt$")


def saved_data_parallel_ranks(states: Path) -> int | None:
    """How many data-parallel ranks wrote the ZeRO states in ``states`` (one optimizer shard each); None at ZeRO
    stage 0, whose optimizer states are whole in the model states and load on any number of ranks."""
    ranks = {int(m.group(1)) for f in states.iterdir() if (m := _OPTIMIZER_SHARD.search(f.name))}
    return len(ranks) or None


def _what_is_there(states: Path, directory: Path) -> str:
    """Why ``states`` has no DeepSpeed model states, by what is there instead."""
    if (states / ".metadata").is_file():
        return ("it was written by --train.backend fsdp2 (torch distributed checkpoint files); resume it with "
                "--train.backend fsdp2")
    if not states.exists():
        return (f"{directory} has no {states.name}/: written with --ckpt.disable_ds or by a run without this model "
                f"(rlhf checkpoint inspect {directory} says what it holds), or damaged (a folder deleted from it): only "
                f"then delete {directory} {CHECKPOINT_WAY_OUT}")
    return f"it is damaged; delete {directory} {CHECKPOINT_WAY_OUT}"


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
    if "PytorchStreamReader" in detail or isinstance(exc, (EOFError, pickle.UnpicklingError)):
        return f"{type(exc).__name__}: {detail}; a file is truncated or corrupt: delete {directory} {CHECKPOINT_WAY_OUT}"
    return (f"{type(exc).__name__}: {detail}; it does not fit this run, or it is damaged: rlhf checkpoint inspect "
            f"{directory} says whether it is complete and which flags wrote it (resume with those); only if it is "
            f"damaged, delete {directory} {CHECKPOINT_WAY_OUT}")


def full_state(directory: Path, tag: str, module: Any, ema: bool = False) -> dict[str, Any]:
    """The whole fp32 state of the model saved under ``directory/tag`` by ``module.state_dict()``'s names, on the CPU
    of this process alone (no process group): ZeRO 1-3 shards joined by DeepSpeed's ``zero_to_fp32``, stage 0's
    whole model states as they are. ``ema``: with the trainable parameters replaced by the EMA saved beside
    (``<tag>_ema/``), whole, taken in ``module``'s order of trainable parameters."""
    import torch

    states = directory / tag
    if not any(states.glob("*model_states.pt")):
        raise CheckpointError(f"checkpoint {states} holds no DeepSpeed model states: {_what_is_there(states, directory)}")
    if saved_data_parallel_ranks(states) is None:
        state = torch.load(next(states.glob("*model_states.pt")), map_location="cpu", weights_only=False)["module"]
        state = {name: tensor.float() if tensor.is_floating_point() else tensor for name, tensor in state.items()}
    else:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        state = dict(get_fp32_state_dict_from_zero_checkpoint(str(directory), tag=tag))
    if ema:
        from rlhf_plugin_deepspeed.ema import resharded

        saved = sorted(states.with_name(f"{tag}_ema").glob("ema_rank*.pt"), key=lambda p: int(p.stem[len("ema_rank"):]))
        if not saved:
            raise CheckpointError(f"checkpoint {directory} has no EMA ({tag}_ema/): it was written without "
                                  "--train.enable_ema; export --model actor instead")
        shadows = [torch.load(path, map_location="cpu")["shadow"] for path in saved]
        trainable = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
        for i, (name, param) in enumerate(trainable):
            state[name] = resharded([shadow[i] for shadow in shadows], param, 0)
    return state


def optimizer_state(directory: Path, tag: str, module: Any) -> dict[str, Any]:
    """The optimizer's states saved under ``directory/tag``, whole, by ``module``'s trainable parameter names, in
    torch's keys (``exp_avg``, ``exp_avg_sq``; Muon's momentum is refused, see
    :data:`rlhf_plugin_deepspeed.neutral_state.MUON_REFUSAL`), and the optimizer steps taken: read from
    DeepSpeed's universal form, which stores each parameter's states whole (converted once, beside the states, as a
    resume on another number of ranks does; every rank calls this, rank 0 converts)."""
    import torch

    from rlhf_plugin_deepspeed.universal import convert

    states = directory / tag
    if not any(states.glob("*model_states.pt")):
        raise CheckpointError(f"checkpoint {states} holds no DeepSpeed model states: {_what_is_there(states, directory)}")
    if saved_data_parallel_ranks(states) is None:
        raise CheckpointError(f"checkpoint {states} was written under --ds.zero_stage 0, whose optimizer states "
                              "DeepSpeed's universal form does not read: resume it with --train.backend deepspeed")
    universal = directory / convert(directory, tag, "read by another --train.backend") / "zero"

    def whole(path: Path) -> Any:
        value = torch.load(path, map_location="cpu", weights_only=False)
        return value["param"] if isinstance(value, dict) else value

    # the optimizer steps the engine took (its scheduler stepped alike); ZeRO-3's universal form has no step.pt
    steps = torch.load(next(states.glob("*model_states.pt")), map_location="cpu", weights_only=False)["global_steps"]
    per_name = {}
    for name, param in module.named_parameters():
        if not param.requires_grad:
            continue
        folder = universal / name
        # ZeRO-3's universal form keeps each state flat; a ZeRO-3 partition's own shape is empty (ds_shape is whole)
        shape = tuple(getattr(param, "ds_shape", None) or param.shape)
        per_name[name] = {path.stem: whole(path).reshape(shape) for path in folder.glob("*.pt")
                          if path.stem not in ("fp32", "step")}
        if "momentum_buffer" in per_name[name]:
            from rlhf_plugin_deepspeed.neutral_state import MUON_REFUSAL

            raise CheckpointError(f"checkpoint {states} was trained with --train.optim muon: {MUON_REFUSAL}")
    return {"state": per_name, "steps": int(steps)}
