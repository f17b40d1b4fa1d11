"""A weight sync whose tensor names do not match the rollout engine's model is an error naming the keys."""

from __future__ import annotations

import pytest
import torch
from rlhf_plugin_hf_generate.engine import HFEngine

CONFIG = {"vllm": {"num_engines": 0}}


def engine(path) -> HFEngine:
    return HFEngine(str(path), "fp32", 64, 0, CONFIG)


def test_a_full_state_loads_and_a_renamed_or_missing_tensor_is_named(tiny_causal_lm_path) -> None:
    hf = engine(tiny_causal_lm_path)
    state = {name: value + 0.5 for name, value in hf.model.state_dict().items()}
    hf.load_weights(state)
    assert hf.max_weight_difference(state) == (0.0, len(state))
    renamed = {("transformer." + name if name == "model.norm.weight" else name): value for name, value in state.items()}
    with pytest.raises(ValueError, match=r"1 unexpected tensor\(s\) \(transformer.model.norm.weight\), 1 missing \(model.norm.weight\)"):
        hf.load_weights(renamed)
    missing = {name: value for name, value in state.items() if "layers.1." not in name}
    with pytest.raises(ValueError, match=r"0 unexpected .* missing \(model.layers.1.input_layernorm.weight, .* and \d+ more\)"):
        hf.load_weights(missing)


def test_a_vlm_may_leave_out_its_vision_encoder_only(tiny_vlm_path) -> None:
    hf = engine(tiny_vlm_path)
    own = {name: value.clone() for name, value in hf.model.state_dict().items()}
    vision = [name for name in own if name.startswith("model.visual.")]
    assert vision
    trainable = {name: value + 0.25 for name, value in own.items() if name not in vision}  # what a frozen-tower sync sends
    hf.load_weights(trainable)
    assert hf.max_weight_difference(trainable)[0] == 0.0
    assert torch.equal(hf.model.state_dict()[vision[0]], own[vision[0]])
    without_head = {name: value for name, value in trainable.items() if name != "lm_head.weight"}
    with pytest.raises(ValueError, match=r"1 missing \(lm_head.weight\)"):
        hf.load_weights(without_head)
