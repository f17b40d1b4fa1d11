"""Reward-model scoring for ``rlhf generate``.

Runs in the CLI process, once per run, after generation (the generation engine is freed
first). Each sample is scored as the core's RL ``RewardModelWorker`` does: the value head
read at the last token of prompt + response, the sequence ending with EOS.

The text ``prompt + response`` is re-tokenized with the *reward model's* tokenizer, so a
reward model with another tokenizer than the policy's works too: special tokens are added
as :func:`rlhf.data.templates.format_prompt` added them for the policy (not with a chat
template, whose text already holds them), and the EOS id is appended unless the sequence
already ends with it (a truncated response gets one too, as OpenRLHF's scoring did).
A sequence longer than the model's ``max_position_embeddings`` (or ``--max_len``) keeps its
head and gets EOS as its last token.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from rlhf.config.base import ConfigError

log = logging.getLogger("rlhf.best_of_n")


def has_trained_head(path: str, head: str) -> bool | None:
    """Whether a safetensors checkpoint at ``path`` stores ``<head>.weight``; ``None`` when it cannot tell.

    ``load_value_model`` silently gives a checkpoint without that head a fresh random one
    (right for a critic, wrong for a reward model), so the command checks first.
    """
    from safetensors import safe_open

    root = Path(path)
    index = root / "model.safetensors.index.json"
    if index.exists():
        keys = json.loads(index.read_text())["weight_map"].keys()
    elif (root / "model.safetensors").exists():
        with safe_open(str(root / "model.safetensors"), framework="pt") as handle:
            keys = list(handle.keys())
    else:
        return None
    return any(k == f"{head}.weight" or k.endswith(f".{head}.weight") for k in keys)


def check_reward_model(path: str, head: str) -> None:
    """Refuse a local checkpoint without a trained value head (cheap: reads safetensors headers only)."""
    if has_trained_head(path, head) is False:
        raise ConfigError(f"--reward_model {path}: the checkpoint has no '{head}' value head, so its rewards would be "
                          "random; pass a trained reward model (or its head's name with --value_head_prefix)")


class RewardScorer:
    """A sequence-regression reward model with its tokenizer; :meth:`score` reads one reward per text."""

    def __init__(self, path: str, dtype: str, attn: str, head: str, normalize: bool, max_len: int) -> None:
        import torch
        from transformers import AutoTokenizer

        from rlhf.models.loading import load_value_model, torch_dtype

        check_reward_model(path, head)
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            self.model = load_value_model(path, torch_dtype(dtype), attn, head).to(self.device).eval()
        except (OSError, ValueError) as exc:
            raise ConfigError(f"--reward_model {path}: {exc}") from exc
        self.head = head
        config = self.model.config
        self.pad_id = config.pad_token_id if config.pad_token_id is not None else (self.tokenizer.pad_token_id or 0)
        self.eos_id = self.tokenizer.eos_token_id
        self.max_len = min(max_len, getattr(config, "max_position_embeddings", None) or max_len)
        # --normalize_reward: (r − μ)/σ with the statistics reward-model training stored in config.json
        self.mean, self.std = 0.0, 1.0
        if normalize:
            mean, std = getattr(config, "mean", None), getattr(config, "std", None)
            if mean is None or std is None:
                log.warning("--normalize_reward: %s/config.json has no 'mean' and 'std'; the rewards are read raw", path)
            else:
                self.mean, self.std = float(mean), float(std)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        """Token ids of one full text, ending with EOS, at most ``max_len`` long."""
        ids = self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]
        if self.eos_id is not None and (not ids or ids[-1] != self.eos_id):
            ids = ids + [self.eos_id]
        if len(ids) > self.max_len:
            ids = ids[: self.max_len]
            if self.eos_id is not None:
                ids[-1] = self.eos_id
        return ids

    def score(self, texts: list[str], add_special_tokens: bool, batch_size: int) -> list[float]:
        """One reward per text, computed in right-padded micro-batches of ``batch_size`` (longest first)."""
        import torch
        from tqdm import tqdm

        from rlhf.models.loading import token_values

        encoded = [self.encode(t, add_special_tokens) for t in texts]
        order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))  # similar lengths share a batch
        rewards = [0.0] * len(encoded)
        with torch.no_grad(), tqdm(total=len(encoded), desc="reward model", unit="sample") as bar:
            for first in range(0, len(order), batch_size):
                rows = order[first : first + batch_size]
                width = max(len(encoded[i]) for i in rows)
                input_ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
                attention = torch.zeros_like(input_ids)
                for j, i in enumerate(rows):
                    input_ids[j, : len(encoded[i])] = torch.tensor(encoded[i])
                    attention[j, : len(encoded[i])] = 1
                values = token_values(self.model, input_ids.to(self.device), attention.to(self.device), head=self.head)
                last = attention.sum(dim=1).to(self.device) - 1
                picked = values.gather(1, last[:, None])[:, 0].tolist()
                for j, i in enumerate(rows):
                    rewards[i] = (picked[j] - self.mean) / self.std
                bar.update(len(rows))
        return rewards
