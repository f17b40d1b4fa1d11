"""A checkpoint's records of its trained groups against the resuming run's: refusals say why and what fits."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlhf.errors import CheckpointError
from rlhf.records.checkpoint_fit import check_fit

DIRECTORY = Path("/runs/ckpt/global_step2")


def record(**changes: object) -> dict:
    return {"backend": "deepspeed", "world_size": 2, "layout": {"zero_stage": 3, "tensor_parallel_size": 1},
            "lora_rank": 0, "ema": False, "model": "/models/base", "states": True, **changes}


def test_the_same_allocation_fits_without_a_note() -> None:
    assert check_fit(DIRECTORY, {"models": {"actor": record()}}, {"actor": record()}) == []


def test_a_checkpoint_written_before_the_records_is_left_to_the_backend() -> None:
    assert check_fit(DIRECTORY, {"step": 2}, {"actor": record(backend="fsdp2")}) == []


def test_another_number_of_ranks_or_layout_is_a_note_not_a_refusal() -> None:
    saved = {"models": {"actor": record(), "critic": record()}}
    now = {"actor": record(world_size=1), "critic": record(layout={"zero_stage": 2, "tensor_parallel_size": 1})}
    assert check_fit(DIRECTORY, saved, now) == ["actor: 2 ranks -> 1", "critic: zero_stage 3 -> 2"]


@pytest.mark.parametrize(("saved", "now", "says"), [
    (record(), record(backend="fsdp2"),
     [f"{DIRECTORY} was written by --train.backend deepspeed and this run uses fsdp2, which cannot load it",
      "backend-neutral full state", "resume it with --train.backend deepspeed",
      f"rlhf checkpoint export {DIRECTORY} --model actor"]),
    (record(lora_rank=8), record(),
     ["trained a LoRA adapter of rank 8 of the actor and this run trains the full model", "--ds.lora.rank 8"]),
    (record(), record(lora_rank=4), ["trained the full model of the actor", "a LoRA adapter of rank 4", "--ds.lora.rank 0"]),
    (record(states=False), record(), ["has no training states", "--ckpt.disable_ds"]),
])
def test_an_intact_checkpoint_that_does_not_fit_says_why_and_never_to_delete_it(saved, now, says) -> None:
    with pytest.raises(CheckpointError) as refused:
        check_fit(DIRECTORY, {"models": {"actor": saved}}, {"actor": now})
    message = str(refused.value)
    assert all(part in message for part in says), message
    assert "delete" not in message and "damaged" not in message


def test_another_backend_is_a_note_where_the_run_converts_from_it_and_a_refusal_elsewhere() -> None:
    """``converts`` (rlhf.config.training_backend.converts_from) is asked with the backend that wrote the group."""
    saved = {"models": {"actor": record()}}
    asked = []

    def converts(backend: str) -> bool:
        asked.append(backend)
        return backend == "deepspeed"

    now = {"actor": record(backend="fsdp2", world_size=1, layout={"sharding": "fully_shard"})}
    assert check_fit(DIRECTORY, saved, now, converts) == ["actor: 2 ranks -> 1, --train.backend deepspeed -> fsdp2"]
    assert asked == ["deepspeed"]
    with pytest.raises(CheckpointError, match="written by --train.backend fsdp2 and this run uses deepspeed, which cannot"):
        check_fit(DIRECTORY, {"models": {"actor": record(backend="fsdp2")}}, {"actor": record()}, converts)


def test_which_backends_a_run_converts_from_is_what_the_two_backends_declare() -> None:
    """The writer exports (full_state_from_checkpoint and optimizer_state_from_checkpoint), the run's backend loads
    (load_full_state): the first-party backends convert each other's checkpoints, and no unregistered backend's."""
    from rlhf.config.ppo import PPOConfig
    from rlhf.config.training_backend import converts_from
    from rlhf.host.plugin_host import PluginHost
    from rlhf.host.selection import PluginSelection

    registry = PluginHost.load(PluginSelection.parse("deepspeed,fsdp2", strict=True)).registry
    config = PPOConfig()
    config.train.backend = "fsdp2"
    assert converts_from(config, registry)("deepspeed") and not converts_from(config, registry)("megatron")
    config.train.backend = "deepspeed"
    assert converts_from(config, registry)("fsdp2") and not converts_from(config, registry)("megatron")


def test_a_group_the_checkpoint_lacks_names_what_it_holds() -> None:
    with pytest.raises(CheckpointError, match=r"holds no critic: the run that wrote it trained actor; .*inspect"):
        check_fit(DIRECTORY, {"models": {"actor": record()}}, {"actor": record(), "critic": record()})


def test_inspect_tells_a_complete_checkpoint_from_an_incomplete_one_and_lists_the_flags_that_differ(tmp_path) -> None:
    import json

    from rlhf.cli.checkpoint_cmd import inspect

    directory = tmp_path / "global_step4"
    (directory / "actor").mkdir(parents=True)
    (directory / "actor" / "states.pt").write_bytes(b"\0" * 1000)
    (directory / "actor_ema").mkdir()
    (directory / "actor_ema" / "ema_rank0.pt").write_bytes(b"\0")
    config = {"ds": {"zero_stage": 3, "lora": {"rank": 0}}, "actor": {"adam": {"lr": 1e-3}}, "train": {"enable_ema": True}}
    state = {"step": 4, "data": {"consumed": 16}, "models": {"actor": record(ema=True)}, "config": config}
    (directory / "state.json").write_text(json.dumps(state))

    report = inspect(directory, ["--ds.zero_stage", "3", "--actor.adam.lr", "0.001", "--train.enable_ema",
                                 "--ds.lora.rank", "8", "--ds.nothing", "1"])
    assert report["step"] == 4 and report["data"] == {"consumed": 16} and report["size_bytes"] > 1000
    assert report["differences"] == ["--ds.lora.rank: 0 in the checkpoint, 8 here",
                                     "--ds.nothing: not a flag of the run that wrote it"]
    assert not report["complete"] and report["problems"] == ["actor_ema/ has 1 EMA files, 2 were written"]
    (directory / "actor_ema" / "ema_rank1.pt").write_bytes(b"\0")
    assert inspect(directory, [])["complete"]
    (directory / "state.json").unlink()
    assert not inspect(directory, [])["complete"]
