"""Prompt rows with images -> prompt text, ids (image tokens expanded) and the model's image inputs."""

from __future__ import annotations

import logging
from typing import Any

from rlhf.errors import ConfigError, DataError

log = logging.getLogger("rlhf.vlm")

#: Model families whose image placeholder this processor expands itself (grid_t·grid_h·grid_w / merge²
#: tokens per image): transformers builds Qwen-VL's AutoProcessor with a video processor, which needs
#: torchvision; the image processor alone has a PIL version. Other families (Idefics3/SmolVLM…) go
#: through the model's AutoProcessor.
QWEN_VL = {"qwen2_vl", "qwen2_5_vl", "qwen3_vl"}


class ImagePromptProcessor:
    """Built once in the controller (``from_config``); ``process(row)`` runs once per prompt row."""

    def __init__(self, model_path: str, input_key: str, image_key: str, max_images: int,
                 template_kwargs: dict[str, Any] | None = None) -> None:
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
        self.template_kwargs = dict(template_kwargs or {})  # --data.chat_template_kwargs
        self.image_token_id = model_config.image_token_id
        if self.model_type in QWEN_VL:
            self.tokenizer = AutoTokenizer.from_pretrained(model_path)
            self.image_processor = AutoImageProcessor.from_pretrained(model_path)
            self.merge = getattr(self.image_processor, "merge_size", 2)
            self.processor = None
        else:
            from transformers import AutoProcessor

            try:
                self.processor = AutoProcessor.from_pretrained(model_path)
            except Exception as exc:  # noqa: BLE001 - a missing or broken processor config surfaces many ways
                raise ConfigError(f"{flag}: cannot load the processor of {model_path} ({type(exc).__name__}: "
                                  f"{' '.join(str(exc).split())[:200]})") from exc
            self.tokenizer = self.processor.tokenizer

    @classmethod
    def from_config(cls, config: Any) -> ImagePromptProcessor:
        data = config.data
        return cls(config.actor.model_name_or_path, data.input_key, data.image_key, data.max_images_per_prompt,
                   data.chat_template_kwargs)

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
        """``{"prompt", "prompt_ids", "media"}``; ``media`` holds the model's image inputs as numpy arrays (Qwen-VL:
        ``pixel_values`` (patches, features), ``image_grid_thw`` (images, 3); Idefics3: ``pixel_values``
        (1, images, 3, H, W), ``pixel_attention_mask``) and ``images``, the PNG-encoded images; None without images."""
        from rlhf_plugin_vlm.images import row_images

        images = row_images(row, self.image_key, self.max_images)
        value = row.get(self.input_key)
        text = self.tokenizer.apply_chat_template(self.messages(value, len(images)), add_generation_prompt=True,
                                                  tokenize=False, **self.template_kwargs)
        if not images:
            return {"prompt": text, "prompt_ids": self.tokenizer(text, add_special_tokens=False)["input_ids"], "media": None}
        encoded = [encode_png(image) for image in images]  # for engines that run their own processor (vLLM)
        if self.processor is not None:
            try:
                out = self.processor(text=[text], images=[images], add_special_tokens=False, return_tensors="np")
            except ValueError as exc:
                raise DataError(f"the model's processor refused the row: {exc}") from None
            media = {key: value for key, value in out.items() if key not in ("input_ids", "attention_mask")}
            return {"prompt": text, "prompt_ids": out["input_ids"][0].tolist(), "media": {**media, "images": encoded}}
        expanded, media = self._qwen_inputs(text, images, "the chat template")
        return {"prompt": text, "prompt_ids": expanded, "media": {**media, "images": encoded}}

    def _qwen_inputs(self, text: str, images: list[Any], placer: str) -> tuple[list[int], dict[str, Any]]:
        """Token ids of ``text`` with each image placeholder expanded to its image's tokens, and the pixels."""
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        pixels = self.image_processor(images=images, return_tensors="np")
        grid = pixels["image_grid_thw"]
        counts = [int(g.prod()) // self.merge**2 for g in grid]
        placeholders = [i for i, token in enumerate(ids) if token == self.image_token_id]
        if len(placeholders) != len(images):
            raise DataError(f"{placer} placed {len(placeholders)} image placeholders for {len(images)} images")
        expanded: list[int] = []
        start = 0
        for position, count in zip(placeholders, counts):
            expanded += ids[start:position] + [self.image_token_id] * count
            start = position + 1
        expanded += ids[start:]
        return expanded, {"pixel_values": pixels["pixel_values"].astype("float32"), "image_grid_thw": grid}

    def extend(self, media: dict[str, Any] | None, text: str, images: list[Any]) -> dict[str, Any]:
        """Environment feedback with images, appended to a trajectory (multi-turn agents; the controller,
        once per feedback): ``{"ids": the feedback's token ids, image tokens expanded, "media": media with the
        images added after the trajectory's own}``. ``images``: PIL images, paths, file:// URLs or base64.
        The feedback text names each image with the model's placeholder (``<|vision_start|><|image_pad|>
        <|vision_end|>`` for Qwen-VL, ``<image>`` for Idefics3); without any, one per image goes first."""
        import numpy as np
        from PIL import Image

        from rlhf_plugin_vlm.images import open_image

        images = [image.convert("RGB") if isinstance(image, Image.Image) else open_image(image, "environment_images")
                  for image in images]
        placeholder = self.processor.image_token if self.processor is not None else "<|vision_start|><|image_pad|><|vision_end|>"
        if text.count(placeholder) == 0:
            text = placeholder * len(images) + text
        encoded = [encode_png(image) for image in images]
        if self.processor is None:
            ids, added = self._qwen_inputs(text, images, "the environment feedback")
            axis = {"pixel_values": 0, "image_grid_thw": 0}
        else:
            out = self.processor(text=[text], images=[images], add_special_tokens=False, return_tensors="np")
            ids = out["input_ids"][0].tolist()
            added = {key: value for key, value in out.items() if key not in ("input_ids", "attention_mask")}
            axis = {key: 1 for key in added}  # Idefics3: (1, images, ...)
        merged = dict(media or {})
        for key, value in added.items():
            merged[key] = value if key not in merged else np.concatenate([np.asarray(merged[key]), value], axis=axis[key])
        merged["images"] = list(merged.get("images") or []) + encoded
        return {"ids": ids, "media": merged}


def encode_png(image: Any) -> bytes:
    import io

    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()
