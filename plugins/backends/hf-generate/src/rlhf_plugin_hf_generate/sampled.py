"""The log-prob of each token ``generate`` samples, kept one step at a time.

``generate(output_logits=True)`` would keep the whole vocabulary's logits of every step until it returns:
chunk x new tokens x vocabulary x 4 B. :class:`SampledLogprobs` is a logits processor instead: each step it
holds one ``(chunk, V)`` fp32 row (log-softmax of that step's logits / temperature) until the next step shows
which token was drawn from it, then keeps that token's log-prob only.
"""

from __future__ import annotations

from typing import Any


class SampledLogprobs:
    """A ``transformers`` logits processor (``processor(input_ids, scores) -> scores``), one per ``generate`` call.

    It must see the logits before temperature and top-p: ``generate`` appends those warpers after the
    processors it is given, so it does. The values are the log-softmax of the raw logits / ``temperature``
    (the distribution sampled, before top-p: the trainer's convention). It also suppresses ``suppressed``
    token ids (a VLM's image placeholders) after reading the row, so their probability stays in the
    log-probs as it does in the trainer's forward, while they are never drawn.
    """

    def __init__(self, temperature: float, suppressed: list[int] | None) -> None:
        self.temperature = temperature
        self.suppressed = suppressed
        self.steps: list[Any] = []  #: per step: (chunk,) log-probs of the tokens drawn there
        self._row: Any = None  #: (chunk, V) fp32 log-probs of the latest step, until its token is known

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        if self._row is not None:  # input_ids now ends with the token drawn from the previous step's row
            self.steps.append(self._take(input_ids[:, -1]))
        self._row = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        if self.suppressed:
            scores = scores.index_fill(-1, torch.tensor(self.suppressed, device=scores.device), float("-inf"))
        return scores

    def logprobs(self, new_tokens: Any) -> Any:
        """``(chunk, N)`` log-probs of ``new_tokens`` (``(chunk, N)``, what ``generate`` returned after the prompt).

        ``generate`` may have run steps past its stop and dropped their tokens (a deferred stop check): those
        steps' entries are cut off; the last kept token's comes from the latest row when no step followed it."""
        import torch

        count = new_tokens.shape[1]
        if len(self.steps) < count:
            self.steps.append(self._take(new_tokens[:, -1]))
        return torch.stack(self.steps[:count], dim=1)

    def _take(self, tokens: Any) -> Any:
        return self._row.gather(-1, tokens[:, None].to(self._row.device)).squeeze(-1)
