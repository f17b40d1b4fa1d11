"""The PRM trainer: its config, how rows become examples and batches, and the loss of a batch.

Runs in the trainer's process(es), one per device (see :mod:`rlhf_supervised.trainer`).
Text is tokenized as is (``--data.input_template`` defaults to none here; set it, or
``--data.apply_chat_template`` to render the text as one user message), so the placeholder
tokens stay where the dataset put them. Each example carries two per-token lists aligned
with its ids: the label token id (or SOFT) at placeholders, IGNORE elsewhere, and the
soft probability; the batch holds them as ``(R, L)`` tensors in the layout of
``input_ids``, padded or packed alike. Units = placeholder positions.
"""

from __future__ import annotations

import functools
from typing import Any, ClassVar

from pydantic import Field
from rlhf_supervised.config import SupervisedConfig, SupervisedDataSection, SupervisedModelSection
from rlhf_supervised.trainer import LossParts, SupervisedTrainer

from rlhf.config.base import ConfigError, flag
from rlhf_plugin_prm.losses import IGNORE, SOFT


class PRMModelSection(SupervisedModelSection):
    placeholder_token: str = flag("ки", "Step-boundary token of the inputs (one token of the tokenizer)")
    reward_tokens: list[str] | None = flag(
        None, "Tokens the placeholder logits are restricted to, e.g. + - (default: the full vocabulary)", nargs="+")


class PRMDataSection(SupervisedDataSection):
    input_template: str | None = flag(None, "Template with one {} around the input text (default: the text as is)")
    label_key: str = flag("label", "Dataset key of the labels: one per placeholder, a reward token or a float p")


class PRMConfig(SupervisedConfig):
    """``rlhf train prm``"""

    model: PRMModelSection = Field(default_factory=PRMModelSection)
    data: PRMDataSection = Field(default_factory=PRMDataSection)


def single_token(tokenizer: Any, text: str, flag_name: str) -> int:
    """The id of ``text`` if the tokenizer encodes it as exactly one token; a ConfigError naming the flag otherwise."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    if len(ids) != 1:
        raise ConfigError(f"{flag_name} {text!r} is {len(ids)} tokens of the tokenizer ({ids}), not one; pass a "
                          "string the tokenizer keeps whole (e.g. one of its special tokens) or add it to the tokenizer")
    return ids[0]


class PRMTrainer(SupervisedTrainer):
    """Process reward model: cross-entropy at step placeholders, mean over placeholders per step."""

    config_class: ClassVar[type[PRMConfig]] = PRMConfig
    shown_metrics: ClassVar[tuple[str, ...]] = ("loss", "acc")

    @functools.cached_property
    def reward_ids(self) -> Any:
        """``(K,)`` long CPU tensor of the reward token ids, or None (the full vocabulary); needs the tokenizer."""
        import torch

        _, ids = self._tokens()
        return None if ids is None else torch.tensor(ids, dtype=torch.long)

    def _tokens(self) -> tuple[int, list[int] | None]:
        """``(placeholder id, reward token ids or None)``, checked against the tokenizer."""
        cfg = self.config.model
        placeholder = single_token(self.tokenizer, cfg.placeholder_token, "--model.placeholder_token")
        if cfg.reward_tokens is None:
            return placeholder, None
        ids = [single_token(self.tokenizer, t, "--model.reward_tokens") for t in cfg.reward_tokens]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"--model.reward_tokens {cfg.reward_tokens} has repeated tokens")
        return placeholder, ids

    def _label(self, value: Any, reward_ids: list[int] | None, where: str) -> tuple[int, float]:
        """One label -> ``(label id or SOFT, soft probability)``."""
        if isinstance(value, str):
            token = single_token(self.tokenizer, value, f"{where}: label")
            if reward_ids is not None and token not in reward_ids:
                raise ConfigError(f"{where}: label {value!r} is not one of --model.reward_tokens "
                                  f"{self.config.model.reward_tokens}")
            return token, 0.0
        if isinstance(value, (bool, int, float)):
            if reward_ids is None or len(reward_ids) != 2:
                raise ConfigError(f"{where}: soft label {value!r} needs exactly two --model.reward_tokens "
                                  "(p goes to the first, 1 - p to the second)")
            if not 0.0 <= float(value) <= 1.0:
                raise ConfigError(f"{where}: soft label {value!r} is not a probability in [0, 1]")
            return SOFT, float(value)
        raise ConfigError(f"{where}: label {value!r} is neither a reward token string nor a float")

    def _text_ids(self, value: Any) -> list[int]:
        from rlhf.data.templates import as_messages

        data = self.config.data
        if data.apply_chat_template:
            text = self.tokenizer.apply_chat_template(as_messages(value), tokenize=False)
            return self.tokenizer(text, add_special_tokens=False)["input_ids"]
        text = data.input_template.format(value) if data.input_template else str(value)
        return self.tokenizer(text)["input_ids"]

    def build_examples(self, rows: list[dict[str, Any]], source: str) -> list[dict[str, Any]]:
        """Rows -> ``{ids, label_ids, probs, length}``, the last two per token (see the module docstring).
        Runs once per dataset, before training; every row must have one label per placeholder."""
        from rlhf.data.sources import row_value

        data = self.config.data
        placeholder, reward_ids = self._tokens()
        examples = []
        for index, row in enumerate(rows):
            where = f"{source} row {index}"
            ids = self._text_ids(row_value(row, data.input_key, "--data.input_key", source, index))
            labels = row_value(row, data.label_key, "--data.label_key", source, index)
            if not isinstance(labels, (list, tuple)):
                labels = [labels]
            positions = [t for t, tok in enumerate(ids) if tok == placeholder]
            if len(positions) != len(labels):
                raise ConfigError(f"{where}: {len(positions)} placeholder tokens "
                                  f"({self.config.model.placeholder_token!r}, --model.placeholder_token) but "
                                  f"{len(labels)} labels (--data.label_key {data.label_key!r}); they must match (check that "
                                  "the tokenizer does not merge the placeholder with the text around it)")
            label_ids, probs = [IGNORE] * len(ids), [0.0] * len(ids)
            for t, value in zip(positions, labels):
                label_ids[t], probs[t] = self._label(value, reward_ids, where)
            examples.append({"ids": ids, "label_ids": label_ids, "probs": probs, "length": len(ids)})
        return examples

    def collate(self, examples: list[dict[str, Any]]) -> Any:
        """Examples -> a batch whose ``extras`` hold ``label_ids`` (long) and ``probs`` (float),
        ``(R, L)`` tensors aligned with ``input_ids`` (IGNORE on padding), on CPU."""
        import torch
        from rlhf_supervised.batch import collate

        packed = self.config.ds.packing_samples

        def aligned(key: str, fill: Any, dtype: Any) -> Any:
            rows = [e[key] for e in examples]
            if packed:
                return torch.tensor([v for r in rows for v in r], dtype=dtype).unsqueeze(0)
            out = torch.full((len(rows), max(len(r) for r in rows)), fill, dtype=dtype)
            for i, r in enumerate(rows):
                out[i, : len(r)] = torch.tensor(r, dtype=dtype)
            return out

        extras = {"label_ids": aligned("label_ids", IGNORE, torch.long), "probs": aligned("probs", 0.0, torch.float)}
        return collate([e["ids"] for e in examples], [[0] * len(e["ids"]) for e in examples], self.pad_id, packed,
                       extras)

    def units(self, batch: Any) -> float:
        return float((batch.extras["label_ids"] != IGNORE).sum())

    def compute(self, batch: Any, training: bool) -> LossParts:
        """Σ cross-entropy over the batch's placeholders; ``acc``: Σ argmax matches."""
        from rlhf_plugin_prm.losses import prm_loss

        reward_ids = None if self.reward_ids is None else self.reward_ids.to(self.device)  # (K,), a tiny copy
        out = self.forward(self.model, batch)  # logits (R, L, V)
        label_ids = batch.extras["label_ids"]
        at = label_ids != IGNORE
        losses, correct = prm_loss(out.logits[at], label_ids[at], batch.extras["probs"][at], reward_ids)
        return LossParts(losses.sum(), {"acc": correct.sum()}, getattr(out, "aux_loss", None))
