"""A DeepSpeed checkpoint that cannot be loaded is one clear CheckpointError, before any engine loads."""

from __future__ import annotations

import pytest
from rlhf_plugin_deepspeed.checkpoint import load_engine
from rlhf_plugin_deepspeed.neutral_state import load_full

from rlhf.errors import CheckpointError


@pytest.mark.parametrize("tag_dir", ["missing", "empty"])
def test_a_checkpoint_without_deepspeed_states_is_refused_before_any_engine_loads(tmp_path, tag_dir) -> None:
    directory = tmp_path / "global_step2"
    directory.mkdir()
    (directory / "state.json").write_text('{"step": 2}')
    if tag_dir == "empty":
        (directory / "actor").mkdir()
    with pytest.raises(CheckpointError, match="holds no DeepSpeed model states") as caught:
        load_engine(None, directory, "actor")  # DeepSpeed would return (None, None) and train on
    assert str(directory / "actor") in str(caught.value) and f"delete {directory}" in str(caught.value)
    # a missing folder may be how the run was set up (no training states written) or damage: both are said;
    # an empty one is damage alone
    assert ("--ckpt.disable_ds" in str(caught.value)) == (tag_dir == "missing")
    assert "damaged" in str(caught.value)


def test_muons_momentum_from_another_backend_is_refused_before_anything_loads() -> None:
    """FSDP2's neutral state of a Muon run (torch's ``momentum_buffer`` beside AdamW's moments) is not put into ZeRO's
    partitions, whose Muon keeps its momentum in a layout of its own: one line says so and what to do instead."""
    import torch

    state = {"layers.0.mlp.up_proj.weight": {"momentum_buffer": torch.ones(4, 2)},
             "embed_tokens.weight": {"exp_avg": torch.ones(8, 2), "exp_avg_sq": torch.ones(8, 2)}}
    with pytest.raises(CheckpointError, match="trained with --train.optim muon: Muon's momentum is not converted to or "
                                              "from DeepSpeed.*--train.backend that wrote it"):
        load_full(None, {}, state, 2)  # before the engine is touched
