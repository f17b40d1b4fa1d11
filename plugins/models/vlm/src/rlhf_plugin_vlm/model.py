"""The VLM model loader (contract: :mod:`rlhf.models.extensions`)."""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rlhf.errors import ConfigError

log = logging.getLogger("rlhf.vlm")


class Options(BaseModel):
    model_config = ConfigDict(extra="forbid")

    train_vision_tower: bool = Field(False, description="also train the vision encoder (frozen by default)")


class VisionLanguageModel:
    def __init__(self, options: Options | None = None) -> None:
        self.options = options or Options()

    @classmethod
    def from_config(cls, config: Any) -> VisionLanguageModel:
        return cls(Options.model_validate(config.plugins.get("vlm", {})))

    def prepare(self, role: str, config: Any) -> None:
        if config.ds.lora.rank > 0:
            raise ConfigError("--ds.lora.rank with --data.image_key: LoRA on vision-language models is not supported yet")

    def load(self, path: str, role: str, config: Any) -> Any:
        """The actor and the reference as image-text-to-text models; other roles stay with the core."""
        if role not in ("actor", "ref"):
            return None
        from transformers import AutoModelForImageTextToText

        from rlhf.models.loading import attn_implementation, dtype_of

        model = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype_of(config),
                                                            attn_implementation=attn_implementation(config.ds.attn_implementation))
        if role == "actor":
            if not self.options.train_vision_tower or config.actor.freeze_visual_encoder:
                tower = vision_tower(model)
                tower.requires_grad_(False)
                log.info("vision tower frozen: %d parameters (--vlm.train_vision_tower trains it)",
                         sum(p.numel() for p in tower.parameters()))
            if config.actor.gradient_checkpointing_enable:
                model.gradient_checkpointing_enable({"use_reentrant": config.actor.gradient_checkpointing_reentrant})
        return model


def vision_tower(model: Any) -> Any:
    from rlhf.models.loading import VISION_MODULES, vision_encoder

    if (found := vision_encoder(model)) is None:
        raise ConfigError(f"{type(model).__name__} has no vision encoder under {', '.join(VISION_MODULES)}")
    return found[1]
