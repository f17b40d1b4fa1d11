"""``sample`` on a served model with one adapter (or none): token-by-token decoding with a KV cache, the
``num_samples`` continuations of one prompt as the rows of one batch.

Each sampled token's log-prob is read from the model's unscaled distribution with the same code the trainer uses
(:func:`rlhf.ops.chunked_logprobs`), so it is the log-prob ``forward`` reports for that token, whatever the
temperature, top-k and top-p that chose it.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from typing import Any

from rlhf_plugin_tinker_server.models import ServedModel
from rlhf_plugin_tinker_server.wire import SampledSequence


@dataclass(frozen=True)
class SamplingRequest:
    """The SDK's ``SampleRequest`` fields this server reads."""

    prompt: list[int]
    num_samples: int
    max_tokens: int
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    stop: tuple[str | int, ...] = ()
    seed: int | None = None
    prompt_logprobs: bool = False
    prompt_logprobs_last_n: int | None = None


class SamplingInputError(ValueError):
    """A sampling request this server cannot answer; the message names the field."""


def check_sampling_request(request: SamplingRequest, served: ServedModel) -> None:
    if not request.prompt:
        raise SamplingInputError("prompt: no tokens")
    if request.num_samples < 1:
        raise SamplingInputError(f"num_samples: {request.num_samples}; at least 1")
    if request.max_tokens < 1:
        raise SamplingInputError(f"sampling_params.max_tokens: {request.max_tokens}; at least 1")
    if len(request.prompt) + request.max_tokens > served.max_context_length:
        raise SamplingInputError(
            f"sampling_params.max_tokens: the prompt's {len(request.prompt)} tokens and "
            f"{request.max_tokens} new ones pass the {served.name} context of "
            f"{served.max_context_length} tokens"
        )
    if request.temperature < 0 or not 0 < request.top_p <= 1:
        raise SamplingInputError(
            f"sampling_params: temperature {request.temperature} (at least 0) and top_p "
            f"{request.top_p} (in (0, 1]) are out of range"
        )
    vocabulary = served.module.config.vocab_size
    if vocabulary is not None and not all(0 <= token < vocabulary for token in request.prompt):
        raise SamplingInputError(f"prompt: a token id outside the vocabulary of {vocabulary}")


def sample(
    served: ServedModel, adapter: str | None, request: SamplingRequest
) -> tuple[list[SampledSequence], list[float] | None]:
    """The samples and, when asked, the prompt's log-probs (NaN where none: the first position and, with
    ``prompt_logprobs_last_n``, the ones before the last N)."""
    import torch

    from rlhf.ops import chunked_logprobs

    device = served.device
    generator = torch.Generator(device=device).manual_seed(request.seed if request.seed is not None else secrets.randbits(63))
    stop_ids = {token for token in request.stop if isinstance(token, int)} | _eos_ids(served)
    stop_texts = [text for text in request.stop if isinstance(text, str)]
    rows = request.num_samples
    ids = torch.tensor([request.prompt] * rows, device=device)
    chosen: list[list[int]] = [[] for _ in range(rows)]
    logprobs: list[list[float]] = [[] for _ in range(rows)]
    reasons: list[str | None] = [None] * rows
    prompt_logprobs = None
    with torch.no_grad(), served.using(adapter) as module:
        out = module(input_ids=ids, use_cache=True)
        if request.prompt_logprobs:
            prompt_logprobs = _prompt_logprobs(out.logits, request)
        for _ in range(request.max_tokens):
            last = out.logits[:, -1:, :]
            next_tokens = _choose(last[:, 0].float(), request, generator)
            picked, _ = chunked_logprobs(
                last,
                torch.arange(rows, device=device)[:, None],
                torch.zeros(1, 1, dtype=torch.long, device=device),
                next_tokens[:, None],
            )
            for row in range(rows):
                if reasons[row] is None:
                    _append(
                        row,
                        int(next_tokens[row]),
                        float(picked[row, 0]),
                        chosen,
                        logprobs,
                        reasons,
                        stop_ids,
                        stop_texts,
                        served,
                    )
            if all(reason is not None for reason in reasons):
                break
            out = module(input_ids=next_tokens[:, None], past_key_values=out.past_key_values, use_cache=True)
    sequences = [SampledSequence(chosen[row], logprobs[row], reasons[row] or "length") for row in range(rows)]
    return sequences, prompt_logprobs


def _append(
    row: int,
    token: int,
    logprob: float,
    chosen: list[list[int]],
    logprobs: list[list[float]],
    reasons: list[str | None],
    stop_ids: set[int],
    stop_texts: list[str],
    served: ServedModel,
) -> None:
    chosen[row].append(token)
    logprobs[row].append(logprob)
    if token in stop_ids:
        reasons[row] = "stop"
    elif stop_texts:
        text = served.tokenizer.decode(chosen[row])
        if any(stop in text for stop in stop_texts):
            reasons[row] = "stop"


def _choose(logits: Any, request: SamplingRequest, generator: Any) -> Any:
    """The next token of each row: greedy at temperature 0, else drawn after temperature, top-k and top-p."""
    import torch

    if request.temperature == 0:
        return logits.argmax(dim=-1)
    scores = logits / request.temperature
    if request.top_k > 0:
        kth = torch.topk(scores, min(request.top_k, scores.shape[-1]), dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, -math.inf)
    if request.top_p < 1:
        ordered, order = scores.sort(dim=-1, descending=True)
        before = ordered.softmax(dim=-1).cumsum(dim=-1) - ordered.softmax(dim=-1)
        ordered = ordered.masked_fill(before >= request.top_p, -math.inf)  # keep the smallest set reaching top_p
        scores = torch.full_like(scores, -math.inf).scatter(-1, order, ordered)
    return torch.multinomial(scores.softmax(dim=-1), 1, generator=generator)[:, 0]


def _prompt_logprobs(logits: Any, request: SamplingRequest) -> list[float]:
    import torch

    from rlhf.ops import chunked_logprobs

    length = len(request.prompt)
    device = logits.device
    targets = torch.tensor(request.prompt[1:], device=device)[None]
    values, _ = chunked_logprobs(
        logits[:1], torch.zeros(1, 1, dtype=torch.long, device=device), torch.arange(length - 1, device=device)[None], targets
    )
    scored = [math.nan] + values[0].tolist()
    if request.prompt_logprobs_last_n is not None:
        scored = [math.nan] * (length - request.prompt_logprobs_last_n) + scored[length - request.prompt_logprobs_last_n :]
    return scored


def _eos_ids(served: ServedModel) -> set[int]:
    """End-of-sequence ids: the tokenizer's and the model's generation config's (an int or a list)."""
    configured = getattr(getattr(served.module, "generation_config", None), "eos_token_id", None)
    found = {served.tokenizer.eos_token_id, *(configured if isinstance(configured, list) else [configured])}
    return {token for token in found if token is not None}
