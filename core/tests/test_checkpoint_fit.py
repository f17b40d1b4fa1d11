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
     [f"{DIRECTORY} was written by --train.backend deepspeed and this run uses fsdp2: resume it with --train.backend "
      f"deepspeed", f"rlhf checkpoint export {DIRECTORY} --model actor"]),
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


def test_a_group_the_checkpoint_lacks_names_what_it_holds() -> None:
    with pytest.raises(CheckpointError, match=r"holds no critic: the run that wrote it trained actor; .*inspect"):
        check_fit(DIRECTORY, {"models": {"actor": record()}}, {"actor": record(), "critic": record()})
