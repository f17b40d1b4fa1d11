"""Prompt rows with images -> prompt text, ids (image tokens expanded) and the model's image inputs."""

from __future__ import annotations

import logging
from typing import Any

from rlhf.errors import ConfigError, DataError

log = logging.getLogger("rlhf.vlm")

#: Model families whose image placeholder the processor expands itself (grid_t·grid_h·grid_w / merge²
#: tokens per image) when the model's AutoProcessor cannot load (transformers builds Qwen-VL's processor
#: with a video processor, which needs torchvision; the image processor alone has a PIL version).
QWEN_VL = {"qwen2_vl", "qwen2_5_vl", "qwen3_vl"}


class ImagePromptProcessor:
    """Built once in the controller (``from_config``); ``process(row)`` runs once per prompt row."""

    def __init__(self, model_path: str, input_key: str, image_key: str, max_images: int) -> None:
        from transformers import AutoConfig, AutoImageProcessor, AutoTokenizer

        flag = "--data.image_key/--data.max_images_per_prompt"
        if max_images < 1:
            raise ConfigError(f"--data.image_key {image_key!r} makes prompts carry images: set --data.max_images_per_prompt >= 1")
        model_config = AutoConfig.from_pretrained(model_path)
        if getattr(model_config, "vision_config", None) is None:
            raise ConfigError(f"{flag}: {model_path} is a text-only model (its config has no vision_config); choose a "
                              "vision-language model or drop the image flags")
        self.model_type = model_config.model_type
        self.input_key, self.image_key, self.max_images = input_key, image_key, max_images
        self.tokenizer = AutoTokenizer.from_pretrained(model_path)
        if self.model_type not in QWEN_VL:
            raise ConfigError(f"{flag}: {model_path} is a {self.model_type} model; the vlm plugin lays out image inputs "
                              f"for {', '.join(sorted(QWEN_VL))}")
        self.image_processor = AutoImageProcessor.from_pretrained(model_path)
        self.image_token_id = model_config.image_token_id
        self.merge = getattr(self.image_processor, "merge_size", 2)

    @classmethod
    def from_config(cls, config: Any) -> ImagePromptProcessor:
        data = config.data
        return cls(config.actor.model_name_or_path, data.input_key, data.image_key, data.max_images_per_prompt)

    def messages(self, value: Any, images: int) -> list[dict[str, Any]]:
        """A plain prompt becomes one user turn with the images first; a conversation gets the images
        in its first user turn (unless that turn already has image parts)."""
        parts = [{"type": "image"}] * images
        if isinstance(value, str):
            return [{"role": "user", "content": [*parts, {"type": "text", "text": value}]}]
        messages = [dict(m) for m in value]
        for message in messages:
            if message.get("role") == "user":
                content = message.get("content")
                if isinstance(content, str):
                    message["content"] = [*parts, {"type": "text", "text": content}]
                break
        return messages

    def process(self, row: dict[str, Any]) -> dict[str, Any]:
        """``{"prompt", "prompt_ids", "media"}``; ``media`` holds ``pixel_values`` (patches, features) and
        ``image_grid_thw`` (images, 3) as numpy arrays, None for a row without images."""
        from rlhf_plugin_vlm.images import row_images

        images = row_images(row, self.image_key, self.max_images)
        value = row.get(self.input_key)
        text = self.tokenizer.apply_chat_template(self.messages(value, len(images)), add_generation_prompt=True,
                                                  tokenize=False)
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if not images:
            return {"prompt": text, "prompt_ids": ids, "media": None}
        pixels = self.image_processor(images=images, return_tensors="np")
        grid = pixels["image_grid_thw"]
        counts = [int(g.prod()) // self.merge**2 for g in grid]
        placeholders = [i for i, token in enumerate(ids) if token == self.image_token_id]
        if len(placeholders) != len(images):
            raise DataError(f"the chat template placed {len(placeholders)} image placeholders for {len(images)} images")
        expanded: list[int] = []
        start = 0
        for position, count in zip(placeholders, counts):
            expanded += ids[start:position] + [self.image_token_id] * count
            start = position + 1
        expanded += ids[start:]
        return {"prompt": text, "prompt_ids": expanded,
                "media": {"pixel_values": pixels["pixel_values"].astype("float32"), "image_grid_thw": grid}}
