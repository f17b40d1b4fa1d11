"""Reaches into rlhf-core 0.1's internal model loading, which plugin API 2 removed (its replacement is the public
rlhf.models.loading)."""

from rlhf.engines.hf_models import load_tokenizer


class LegacyExecutor:
    def __init__(self, model: str) -> None:
        self.tokenizer = load_tokenizer(model)
