"""The reward server: any reward function, or a reward model, behind OpenRLHF's protocol.

``POST /get_reward`` with ``{"query": [str], "prompts": [str], "labels": [...]}`` answers
``{"rewards": [...], "scores": [...], "extra_logs": {...}}``; ``GET /health`` answers
``{"status": "ok", "reward": NAME}``. Binds 127.0.0.1 unless ``--host`` says otherwise.

Every refusal is a JSON body ``{"error": "<the reason in words>"}``, so a client can show it:
413 for a body over ``--max_request_bytes`` (checked on ``Content-Length`` and counted while a
chunked body streams in, so no oversized body is held in memory; the rest of it is read and dropped, up to
``DISCARD_MAX_BYTES``, before the 413 and a closed connection, so a client still sending reads the answer
instead of a reset), 422 for a body that does not
fit the protocol, 500 when the reward raises or returns NaN/infinity (JSON cannot carry them).
"""

from __future__ import annotations

import hmac
import logging
import math
from typing import Any

from pydantic import BaseModel

from rlhf.errors import ConfigError
from rlhf.models.loading import check_model_source, torch_dtype
from rlhf.reward_output import non_finite_samples
from rlhf.reward_terms import call_reward

log = logging.getLogger("rlhf.serving")

DEFAULT_MAX_REQUEST_BYTES = 16 * 1024 * 1024
DISCARD_MAX_BYTES = 1024**3  # past this much of a refused body, the connection is dropped without an answer
PROTOCOL = '{"query": [str], "prompts": [str] (optional), "labels": [...] (optional)}'


def model_reward(path: str, *, dtype: str = "fp32", max_len: int | None = None, batch_size: int | None = None,
                 normalize: bool = False) -> Any:
    """A batched reward function backed by a reward model: the head's value at the last token, in batches of
    ``batch_size`` queries (None: the whole request) cut to ``max_len`` tokens (None: whole). ``normalize``:
    ``(value - mean) / std`` with the statistics ``rlhf train rm`` records in the model's ``config.json``."""
    check_model_source(path, "--model")
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    try:
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, dtype=torch_dtype(dtype)).eval()
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--model {path}: cannot load a reward model from it ({type(exc).__name__}: {exc})") from exc
    mean, std = getattr(model.config, "mean", None), getattr(model.config, "std", None)
    if normalize and (mean is None or not std):
        raise ConfigError(f"--model {path}: --normalize needs the reward statistics (mean, std) that rlhf train rm "
                          "records in config.json, and this model has none; serve it without --normalize")
    shift, scale = (float(mean), float(std)) if normalize else (0.0, 1.0)

    def reward(queries: list[str], prompts: list[str], labels: list[Any], **kwargs: Any) -> list[float]:
        step = batch_size or max(1, len(queries))
        out: list[float] = []
        for start in range(0, len(queries), step):
            encoded = tokenizer(queries[start:start + step], padding=True, truncation=max_len is not None,
                                max_length=max_len, return_tensors="pt")
            with torch.no_grad():
                values = model(**encoded).logits[:, 0].float()
            out += ((values - shift) / scale).tolist()
        return out

    return reward


class RewardRequest(BaseModel):
    """OpenRLHF's request body; ``prompts`` and ``labels`` may be left out."""

    query: list[str]
    prompts: list[str] | None = None
    labels: list[Any] | None = None


class RequestRefused(Exception):
    """A request the server answers with ``status`` and ``{"error": message}``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


async def read_body(request: Any, limit: int) -> bytes:
    """The request body, refused (413) as soon as it is known to be over ``limit`` bytes."""
    fix = "send smaller batches, or restart the server with a larger --max_request_bytes"
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        await _discard(request, 0)
        raise RequestRefused(413, f"the request body of {int(declared)} bytes is over this server's limit of "
                                  f"{limit} bytes (--max_request_bytes); {fix}")
    chunks, size = [], 0
    async for chunk in request.stream():  # a chunked body has no Content-Length: count it as it arrives
        size += len(chunk)
        if size > limit:
            await _discard(request, size)
            raise RequestRefused(413, f"the request body is over this server's limit of {limit} bytes "
                                      f"(--max_request_bytes); {fix}")
        chunks.append(chunk)
    return b"".join(chunks)


async def _discard(request: Any, received: int) -> None:
    """Read the rest of a refused body and drop it. Answering while the client still sends lets the server close
    a connection with unread bytes: the client's kernel sees a reset and the client never reads the 413."""
    from starlette.requests import ClientDisconnect

    try:
        async for chunk in request.stream():
            received += len(chunk)
            if received > DISCARD_MAX_BYTES:
                return
    except ClientDisconnect:  # the client gave up: nobody is left to answer
        return


def parse_request(body: bytes) -> RewardRequest:
    """The body as a :class:`RewardRequest` with equally long lists, or a 422 that says what is wrong."""
    from pydantic import ValidationError

    try:
        request = RewardRequest.model_validate_json(body)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors()[:5])
        raise RequestRefused(422, f"the request body does not fit the protocol {PROTOCOL}: {problems}") from None
    count = len(request.query)
    for key, values in (("prompts", request.prompts), ("labels", request.labels)):
        if values is not None and len(values) != count:
            raise RequestRefused(422, f"'{key}' has {len(values)} items for {count} queries; "
                                      f"query, prompts and labels must have the same length")
    return request


def score(reward: Any, source: str, request: RewardRequest) -> tuple[int, dict[str, Any]]:
    """The status and JSON answer for one request: the rewards, or a 500 that names the failure."""

    count = len(request.query)
    prompts = request.prompts if request.prompts is not None else [""] * count
    labels = request.labels if request.labels is not None else [""] * count
    try:
        out = call_reward(reward, request.query, prompts, labels, source=source)
    except Exception as exc:  # noqa: BLE001 - the reward's failure goes back to the client in words
        log.exception("%s failed on a request of %d samples", source, count)
        # call_reward's own checks of the result already start with the source
        message = str(exc) if str(exc).startswith(f"{source}:") else f"{source} raised {type(exc).__name__}: {exc}"
        return 500, {"error": message}
    bad = _non_finite(out)
    if bad:
        return 500, {"error": f"{source} returned {bad}; JSON cannot carry NaN or infinity, "
                              f"so the reward must return finite numbers"}
    return 200, {"rewards": out.rewards, "scores": out.scores, "extra_logs": out.extra_logs}


def _non_finite(out: Any) -> str | None:
    """Where a reward output holds NaN or infinity, in words (JSON cannot carry either)."""
    bad = non_finite_samples(out)
    if bad:
        index, values = next(iter(bad.items()))
        return f"{values} for sample {index}"
    return next((f"{value} in extra_logs {key!r}" for key, value in out.extra_logs.items() if not math.isfinite(value)), None)


def authorized(headers: Any, api_key: str | None) -> bool:
    """Whether a request carries ``api_key`` (``Authorization: Bearer KEY`` or ``X-Api-Key: KEY``); any request
    passes when the server has no key."""
    if not api_key:
        return True
    bearer = headers.get("authorization", "")
    offered = [bearer[7:].strip() if bearer.lower().startswith("bearer ") else "", headers.get("x-api-key", "")]
    return any(key and hmac.compare_digest(key.encode(), api_key.encode()) for key in offered)


def build_app(reward: Any, name: str, source: str | None = None,
              max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES, api_key: str | None = None) -> Any:
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse
    from starlette.concurrency import run_in_threadpool

    source = source or f"reward {name!r}"
    app = FastAPI(title=f"rlhf reward server: {name}")

    @app.get("/health")
    def health() -> dict[str, str]:
        return {"status": "ok", "reward": name}

    async def get_reward(request: Any) -> JSONResponse:
        if not authorized(request.headers, api_key):
            return JSONResponse({"error": "this server needs its API key: send Authorization: Bearer KEY or X-Api-Key: KEY "
                                          "(an rlhf run sends the key in its environment variable RLHF_REWARD_API_KEY)"}, status_code=401)
        try:
            parsed = parse_request(await read_body(request, max_request_bytes))
        except RequestRefused as refused:
            # after a refused body the connection's state is the client's guess: answer, then close it
            headers = {"Connection": "close"} if refused.status == 413 else None
            return JSONResponse({"error": str(refused)}, status_code=refused.status, headers=headers)
        # reward functions are synchronous and may be slow: keep them off the event loop
        status, answer = await run_in_threadpool(score, reward, source, parsed)
        return JSONResponse(answer, status_code=status)

    # a plain Starlette route: the body is read here, under the size limit, not by FastAPI's parser
    app.add_route("/get_reward", get_reward, methods=["POST"])
    return app
