"""The format reward (see the package docstring)."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

THINK_ANSWER = r"\s*<think>.*?</think>\s*<answer>.*?</answer>\s*"


class FormatOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    pattern: str = Field(THINK_ANSWER, description="regex the whole response must match")
    strip: list[str] = Field(["</s>", "<|endoftext|>", "<|im_end|>"], description="tokens removed before matching")

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from None
        return value


class FormatReward:
    def __init__(self, options: FormatOptions | None = None) -> None:
        self.options = options or FormatOptions()
        self.regex = re.compile(self.options.pattern, re.DOTALL)

    @classmethod
    def from_config(cls, config: Any) -> FormatReward:
        return cls(FormatOptions.model_validate(config.plugins.get("format", {})))

    def __call__(self, queries: list[str], prompts: list[str], labels: list[Any], **columns: Any) -> list[float]:
        rewards = []
        for query, prompt in zip(queries, prompts):
            response = query[len(prompt):]
            for token in self.options.strip:
                response = response.replace(token, "")
            rewards.append(float(self.regex.fullmatch(response) is not None))
        return rewards
