"""Prompt rows with images: what the processor returns, and bad image input named by row."""

from __future__ import annotations

import base64
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from rlhf_plugin_vlm.processor import ImagePromptProcessor

from rlhf.config.ppo import DataSection
from rlhf.data.prompts import build_prompts
from rlhf.errors import ConfigError, DataError


def square(path: Path, colour: tuple[int, int, int] = (200, 20, 20)) -> Path:
    Image.new("RGB", (56, 56), colour).save(path)
    return path


@pytest.fixture
def processor(tiny_vlm_path: Path) -> ImagePromptProcessor:
    return ImagePromptProcessor(str(tiny_vlm_path), "input", "images", max_images=2)


def data(**overrides) -> DataSection:
    return DataSection(**{"image_key": "images", "max_images_per_prompt": 2, "max_len": 256, "label_key": "label", **overrides})


def test_ids_hold_one_image_token_per_merged_patch_and_the_model_reads_them(processor, tiny_vlm_path, tmp_path) -> None:
    from transformers import AutoModelForImageTextToText

    png = square(tmp_path / "a.png")
    encoded = base64.b64encode(png.read_bytes()).decode()
    rows = [{"input": "colour?", "images": [str(png)]}, {"input": "colour?", "images": f"file://{png}"},
            {"input": "colour?", "images": [f"data:image/png;base64,{encoded}", encoded]}, {"input": "no image"}]
    out = [processor.process(row) for row in rows]
    image_token = processor.image_token_id
    assert [sum(t == image_token for t in o["prompt_ids"]) for o in out] == [4, 4, 8, 0]  # 56x56 -> 2x2 merged patches
    assert out[0]["prompt_ids"] == out[1]["prompt_ids"] and out[3]["media"] is None
    assert out[2]["media"]["image_grid_thw"].tolist() == [[1, 4, 4], [1, 4, 4]]
    np.testing.assert_array_equal(out[0]["media"]["pixel_values"], out[1]["media"]["pixel_values"])
    assert out[0]["prompt"].startswith("<|user|><|vision_start|><|image_pad|><|vision_end|>colour?")
    model = AutoModelForImageTextToText.from_pretrained(tiny_vlm_path, dtype=torch.float32).eval()
    red, blue = processor.process(rows[0]), processor.process({"input": "colour?", "images": [str(square(tmp_path / "b.png", (0, 0, 200)))]})
    with torch.no_grad():
        logits = [model(input_ids=torch.tensor([o["prompt_ids"]]), pixel_values=torch.from_numpy(o["media"]["pixel_values"]),
                        image_grid_thw=torch.from_numpy(o["media"]["image_grid_thw"])).logits[0, -1] for o in (red, blue)]
    assert (logits[0] - logits[1]).abs().max() > 1e-4  # the answer depends on the image


@pytest.mark.parametrize(("images", "message"), [
    (["missing.png"], "image file missing.png under 'images' does not exist"),
    ("CORRUPT", "cannot be read as an image"),
    (["A", "B", "C"], "has 3 images under 'images', more than --data.max_images_per_prompt 2"),
    (["http://example.com/x.png"], "is a web URL; download it and give the local path"),
    (["not base64 !"], "is neither an existing file nor base64 image data"),
])
def test_bad_image_input_names_file_row_and_image(processor, tmp_path, images, message) -> None:
    if images == "CORRUPT":
        (tmp_path / "bad.png").write_bytes(b"\x89PNG not really")
        images = [str(tmp_path / "bad.png")]
    elif images == ["A", "B", "C"]:
        images = [str(square(tmp_path / f"{i}.png")) for i in range(3)]
    rows = [{"input": "ok", "images": [str(square(tmp_path / "ok.png"))], "label": "red"},
            {"input": "bad", "images": images, "label": "red"}]
    with pytest.raises(DataError) as err:
        build_prompts(rows, data(), processor.tokenizer, "prompts.jsonl", processor=processor)
    assert str(err.value).startswith("prompts.jsonl row 1: ") and message in str(err.value)


def test_text_only_model_with_an_image_key_is_a_config_error(tiny_causal_lm_path) -> None:
    with pytest.raises(ConfigError, match="is a text-only model .* no vision_config"):
        ImagePromptProcessor(str(tiny_causal_lm_path), "input", "images", max_images=1)
    with pytest.raises(ConfigError, match="set --data.max_images_per_prompt >= 1"):
        ImagePromptProcessor(str(tiny_causal_lm_path), "input", "images", max_images=0)


def test_image_tokens_count_toward_max_len_and_dropped_rows_are_counted(processor, tmp_path, caplog) -> None:
    rows = [{"input": "x", "images": [str(square(tmp_path / "a.png"))]}, {"input": "x"}]
    with_image, without = (len(processor.process(row)["prompt_ids"]) for row in rows)
    assert with_image == without + 6  # start, 4 image tokens, end
    with caplog.at_level(logging.WARNING):
        kept = build_prompts(rows, data(max_len=without + 3, label_key=None), processor.tokenizer, "p.jsonl", processor=processor)
    assert [p["media"] for p in kept] == [None]
    assert "p.jsonl: dropped 1 of 2 prompts" in caplog.text and "(row 0)" in caplog.text


def test_idefics3_rows_go_through_the_models_own_processor(tiny_idefics3_path, tmp_path) -> None:
    from transformers import AutoModelForImageTextToText

    from rlhf.media import collate_media

    processor = ImagePromptProcessor(str(tiny_idefics3_path), "input", "images", max_images=1)
    out = processor.process({"input": "colour?", "images": [str(square(tmp_path / "a.png"))]})
    tokens = processor.tokenizer.convert_ids_to_tokens(out["prompt_ids"])
    assert tokens[:8] == ["<|user|>", "<fake_token_around_image>", "<global-img>", *["<image>"] * 4, "<fake_token_around_image>"]
    assert out["media"]["pixel_values"].shape == (1, 1, 3, 64, 64) and len(out["media"]["images"]) == 1
    model = AutoModelForImageTextToText.from_pretrained(tiny_idefics3_path, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([out["prompt_ids"]]), **collate_media([out["media"]])).logits
    assert torch.isfinite(logits).all() and logits.shape[1] == len(out["prompt_ids"])


def test_the_runs_chat_template_variables_reach_the_vlm_prompt(tiny_vlm_path: Path) -> None:
    """--data.chat_template_kwargs reaches the processor's template as it reaches the text prompts' (a thinking
    switch, a reasoning effort)."""
    quiet = ImagePromptProcessor(str(tiny_vlm_path), "input", "images", max_images=2,
                                 template_kwargs={"enable_thinking": False})
    plain = ImagePromptProcessor(str(tiny_vlm_path), "input", "images", max_images=2)
    for made in (quiet, plain):
        made.tokenizer.chat_template += "{% if enable_thinking is defined and not enable_thinking %}<no-think>{% endif %}"
    assert quiet.process({"input": "hi"})["prompt"].endswith("<|assistant|><no-think>")
    assert plain.process({"input": "hi"})["prompt"].endswith("<|assistant|>")
