"""The KD trainer: its config, examples and loss (see the package docstring).

:meth:`KDTrainer.prepare_config` runs in the ``rlhf`` CLI process before anything is
loaded; everything else runs in the trainer's process(es), one per device, inside the
loop of :class:`rlhf_supervised.trainer.SupervisedTrainer`.
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import Field
from rlhf_supervised.config import FrozenModelSection, PromptResponseDataSection, SupervisedConfig, SupervisedModelSection
from rlhf_supervised.trainer import LossParts, SupervisedTrainer

from rlhf.config.base import ConfigError, flag


class KDModelSection(SupervisedModelSection):
    kd_coef: float = flag(0.4, "Weight α of the distillation term: loss = (1 − α)·NLL + α·KD, α in [0, 1]")


class TeacherSection(FrozenModelSection):
    """The frozen teacher, evaluated on every micro-batch (ZeRO-3 partitioned when training is)."""

    model_name_or_path: str | None = flag(None, "HF model name or path of the teacher (required; the student's tokenizer)")


class KDConfig(SupervisedConfig):
    """``rlhf train kd``"""

    model: KDModelSection = Field(default_factory=KDModelSection)
    data: PromptResponseDataSection = Field(default_factory=PromptResponseDataSection)
    teacher: TeacherSection = Field(default_factory=TeacherSection)


class KDTrainer(SupervisedTrainer):
    """Knowledge distillation: (1 − α)·NLL + α·cross-entropy to the teacher's distribution, token mean per step."""

    config_class: ClassVar[type[KDConfig]] = KDConfig
    frozen_sections: ClassVar[tuple[str, ...]] = ("teacher",)
    shown_metrics: ClassVar[tuple[str, ...]] = ("loss", "kd")

    @classmethod
    def prepare_config(cls, config: KDConfig, plugins: Any) -> KDConfig:
        """Cross-flag checks, in the CLI process before any model is loaded (exit status 2 on error)."""
        if not config.teacher.model_name_or_path:
            raise ConfigError("--teacher.model_name_or_path is required: the teacher model to distil from "
                              "(it must use the student's tokenizer)")
        if not 0.0 <= config.model.kd_coef <= 1.0:
            raise ConfigError(f"--model.kd_coef must be in [0, 1] (the weight of KD against NLL), got {config.model.kd_coef}")
        return super().prepare_config(config, plugins)

    def build_examples(self, rows: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
        """Rows -> ``{ids, mask, length}``: prompt + response tokens, the mask over the response (and EOS)."""
        from rlhf_supervised.conversations import row_prompt_response

        examples = []
        for index, row in enumerate(rows):
            ids, mask = row_prompt_response(row, self.config.data, self.tokenizer, source, index)
            examples.append({"ids": ids, "mask": mask, "length": len(ids)})
        return examples

    def compute(self, batch: Any, training: bool) -> LossParts:
        """One micro-batch on ``self.device``: the teacher's forward (no grad), then the student's.

        Returns sums over the batch's trained tokens: the mixed loss, and ``nll`` and ``kd`` as metrics.
        Only the logits of trained positions are kept from the teacher, ``(T, V)`` instead of ``(R, L, V)``.
        """
        import torch

        from rlhf_plugin_kd.losses import at_positions, distill_terms, match_vocab, mix, response_rows, response_targets

        mask = batch.loss_mask
        with torch.no_grad():
            teacher_rows = response_rows(self.frozen["teacher"](**batch.model_inputs()).logits, mask)
        out = self.forward(self.model, batch)
        student_rows = response_rows(out.logits, mask)
        teacher_rows = match_vocab(teacher_rows, student_rows.shape[-1], len(self.tokenizer))
        nll, kd = distill_terms(student_rows, teacher_rows, response_targets(batch.input_ids, mask))
        nll, kd = at_positions(nll, mask) * mask, at_positions(kd, mask) * mask  # (R, L), 0 where not trained
        loss_sum = mix(nll, kd, self.config.model.kd_coef).sum()
        return LossParts(loss_sum, {"nll": nll.detach().sum(), "kd": kd.detach().sum()}, getattr(out, "aux_loss", None))

    def setup(self) -> None:
        """After the models load, before the first step: their vocabulary sizes must match (see ``check_vocab``)."""
        from rlhf_plugin_kd.losses import check_vocab

        def vocab(engine: Any) -> int | None:
            config = engine.module.config
            text = config.get_text_config() if hasattr(config, "get_text_config") else config
            return getattr(text, "vocab_size", None)

        teacher, student = vocab(self.frozen["teacher"]), vocab(self.model)
        if teacher is not None and student is not None:
            try:
                check_vocab(teacher, student, len(self.tokenizer))
            except ConfigError as exc:
                raise ConfigError(f"--teacher.model_name_or_path {self.config.teacher.model_name_or_path}: {exc}") from None
