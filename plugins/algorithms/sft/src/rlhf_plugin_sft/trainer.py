"""The SFT trainer: examples, loss, and its config (see the package docstring)."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field
from rlhf_supervised.config import PromptResponseDataSection, SupervisedConfig, SupervisedModelSection
from rlhf_supervised.trainer import LossParts, SupervisedTrainer

from rlhf.config.base import flag


class SFTModelSection(SupervisedModelSection):
    pretrain_mode_enable: bool = flag(False, "Train on every token of --data.input_key (continued pretraining)", switch=True)


class SFTDataSection(PromptResponseDataSection):
    multiturn: bool = flag(False, "--data.input_key holds whole conversations; train on every assistant turn", switch=True)


class SFTConfig(SupervisedConfig):
    """``rlhf train sft``"""

    model: SFTModelSection = Field(default_factory=SFTModelSection)
    data: SFTDataSection = Field(default_factory=SFTDataSection)


def nll_sum(logprobs: Any, loss_mask: Any) -> Any:
    """Σ −log p over trained tokens; ``(R, L)`` log-probs and mask -> scalar."""
    return -(logprobs * loss_mask).sum()


class SFTTrainer(SupervisedTrainer):
    """Supervised fine-tuning: masked NLL, token mean per optimizer step."""

    config_class: ClassVar[type[SFTConfig]] = SFTConfig

    def build_examples(self, rows: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
        from rlhf_supervised.conversations import conversation, pretrain_text, row_prompt_response

        from rlhf.data.sources import row_value

        data = self.config.data
        examples = []
        for index, row in enumerate(rows):
            if data.multiturn or self.config.model.pretrain_mode_enable:
                value = row_value(row, data.input_key, "--data.input_key", source, index)
                if data.multiturn:
                    ids, mask = conversation(value, self.tokenizer, source, index, data)
                else:
                    ids, mask = pretrain_text(str(value), self.tokenizer)
            else:
                ids, mask = row_prompt_response(row, data, self.tokenizer, source, index)
            examples.append({"ids": ids, "mask": mask, "length": len(ids)})
        return examples

    def compute(self, batch: Any, training: bool) -> LossParts:
        from rlhf_supervised.batch import token_logprobs

        out = self.forward(self.model, batch)
        return LossParts(nll_sum(token_logprobs(out.logits, batch), batch.loss_mask), {}, getattr(out, "aux_loss", None))
