"""The HTTP routes the ``tinker`` SDK calls (``/api/v1/...``), on a :class:`.service.TinkerService`.

JSON bodies are read with the SDK's own request types (``tinker.types``), so a body that does not fit is refused
with 422 and the fields that are wrong. A request that computes answers with a future id at once
(``{"request_id": ...}``); ``/api/v1/retrieve_future`` holds each poll up to :data:`LONG_POLL_S` seconds and then
answers the result, ``{"type": "try_again"}``, or ``{"error": ..., "category": "user" | "server"}`` (the SDK raises
``tinker.RequestFailedError`` with that message). Every route but the health check needs ``X-API-Key`` when the
server has a key.
"""

import hmac
from typing import Any

from rlhf_plugin_tinker_server.models import LoraShape
from rlhf_plugin_tinker_server.sampling import SamplingRequest
from rlhf_plugin_tinker_server.service import Result, SamplerWeights, TinkerService, UserInputError
from rlhf_plugin_tinker_server.sessions import SessionEnded, SessionUnknown
from rlhf_plugin_tinker_server.wire import PROTO_CONTENT_TYPE, WireError, decode_forward_backward

LONG_POLL_S = 20.0  # under the SDK's 45 s read timeout for a retrieval
#: The SDK's feature flags, answered to ``/api/v1/client/config``: API keys (no JWT exchange), one forward_backward
#: chunk at a time, per-request polling, custom losses on the client
CLIENT_CONFIG = {
    "pjwt_auth_enabled": False,
    "parallel_fwdbwd_chunks": False,
    "proto_compress_fwdbwd": False,
    "sample_use_retrieve_futures": False,
    "custom_loss_server_side": False,
    "sample_join_sampling_session": False,
}


class Refused(Exception):
    """A request answered ``status`` with ``{"detail": message}``, which the SDK shows in its error."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def build_app(service: TinkerService, api_key: str | None) -> Any:
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, Response

    app = FastAPI(title="rlhf tinker server")

    @app.exception_handler(Refused)
    async def refused(_: Request, exc: Refused) -> JSONResponse:
        return JSONResponse({"detail": str(exc)}, status_code=exc.status)

    @app.middleware("http")
    async def check_key(request: Request, call_next: Any) -> Any:
        offered = request.headers.get("x-api-key", "")
        if (
            api_key
            and request.url.path not in ("/api/v1/healthz", "/health")
            and not (offered and hmac.compare_digest(offered.encode(), api_key.encode()))
        ):
            return JSONResponse(
                {
                    "detail": "this server needs its API key: ServiceClient(api_key=...) or "
                    "TINKER_API_KEY, the key given to rlhf serve tinker --api-key"
                },
                status_code=401,
            )
        return await call_next(request)

    async def body(request: Request, type_name: str) -> Any:
        import tinker.types
        from pydantic import ValidationError

        try:
            return getattr(tinker.types, type_name).model_validate(await request.json())
        except ValidationError as exc:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors()[:5])
            raise Refused(422, f"the body is not a {type_name}: {problems}") from None
        except ValueError:
            raise Refused(422, f"the body is not JSON (a {type_name} was expected)") from None

    def known(call: Any, *args: Any) -> Any:
        try:
            return call(*args)
        except UserInputError as exc:
            raise Refused(404, str(exc)) from None

    def open_session(session_id: str, *, heard: bool = False) -> None:
        try:
            service.sessions.require(session_id, heard=heard)
        except SessionUnknown as exc:
            raise Refused(404, str(exc)) from None
        except SessionEnded as exc:
            raise Refused(410, str(exc)) from None  # the SDK stops the session's heartbeat on a 410

    @app.get("/api/v1/healthz")
    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/api/v1/client/config")
    async def client_config() -> dict[str, Any]:
        return CLIENT_CONFIG

    @app.post("/api/v1/client/dynamic_config")
    async def client_dynamic_config() -> dict[str, Any]:
        return {}

    @app.post("/api/v1/telemetry")
    async def telemetry() -> dict[str, str]:
        return {"status": "accepted"}  # the SDK's usage reports are accepted and dropped: nothing leaves this machine

    @app.get("/api/v1/get_server_capabilities")
    async def capabilities() -> dict[str, Any]:
        return {
            "supported_models": [
                {"model_name": name, "max_context_length": served.max_context_length, "trainable": True, "sampleable": True}
                for name, served in service.models.items()
            ]
        }

    @app.post("/api/v1/create_session")
    async def create_session(request: Request) -> dict[str, Any]:
        await body(request, "CreateSessionRequest")
        return {"type": "create_session", "session_id": service.sessions.open()}

    @app.post("/api/v1/session_heartbeat")
    async def heartbeat(request: Request) -> dict[str, Any]:
        open_session((await body(request, "SessionHeartbeatRequest")).session_id, heard=True)
        return {"type": "session_heartbeat"}

    @app.post("/api/v1/sessions/{session_id}/finish")
    async def finish(session_id: str) -> dict[str, Any]:
        service.sessions.end(session_id, "its client closed it")
        return {}

    @app.post("/api/v1/create_model")
    async def create_model(request: Request) -> dict[str, Any]:
        parsed = await body(request, "CreateModelRequest")
        open_session(parsed.session_id)
        served = known(service.served, parsed.base_model)
        lora = parsed.lora_config
        if lora is None or lora.rank < 1:
            raise Refused(422, "lora_config: this server trains LoRA adapters (rank 1 or more) only so far")
        if parsed.optimizer_config.type != "adamw":
            raise Refused(422, f"optimizer_config: {parsed.optimizer_config.type!r}; this server steps AdamW only")
        shape = LoraShape(lora.rank, lora.train_attn, lora.train_mlp, lora.train_unembed)
        model_id = service.model_id(parsed.session_id, parsed.model_seq_id)

        def create() -> Result:
            service.create_run(model_id, served, shape, lora.seed)
            return Result(body={"model_id": model_id, "type": "create_model"})

        return {"request_id": service.submit(create), "model_id": model_id}

    @app.post("/api/v1/save_weights")
    async def save_weights(request: Request) -> dict[str, Any]:
        parsed = await body(request, "SaveWeightsRequest")
        if parsed.path is None:
            raise Refused(422, "path: save_state needs a checkpoint name")
        request_id = service.submit(lambda: service.save_state(parsed.model_id, parsed.path, parsed.overwrite))
        return {"request_id": request_id, "model_id": parsed.model_id}

    @app.post("/api/v1/load_weights")
    async def load_weights(request: Request) -> dict[str, Any]:
        parsed = await body(request, "LoadWeightsRequest")
        if parsed.session_id is not None:  # create_training_client_from_state: a new run, made from the checkpoint
            open_session(parsed.session_id)
            if parsed.model_seq_id is None:
                raise Refused(422, "model_seq_id: loading into a new run needs it, with session_id")
            model_id = service.model_id(parsed.session_id, parsed.model_seq_id)
            new_run_on: str | None = parsed.base_model or ""
        elif parsed.model_id is not None:  # TrainingClient.load_state: into the run that exists
            model_id, new_run_on = parsed.model_id, None
        else:
            raise Refused(422, "session_id or model_id: load_weights needs one")
        if parsed.optimizer_config is not None and parsed.optimizer_config.type != "adamw":
            raise Refused(422, f"optimizer_config: {parsed.optimizer_config.type!r}; this server steps AdamW only")
        request_id = service.submit(lambda: service.load_state(model_id, parsed.path, parsed.optimizer, new_run_on=new_run_on))
        return {"request_id": request_id, "model_id": model_id}

    @app.post("/api/v1/get_info")
    async def get_info(request: Request) -> dict[str, Any]:
        run = known(service.run, (await body(request, "GetInfoRequest")).model_id)
        return {
            "type": "get_info",
            "model_id": run.model_id,
            "is_lora": True,
            "lora_rank": run.shape.rank,
            "model_name": run.served.name,
            "model_data": {"arch": run.served.arch, "model_name": run.served.name, "tokenizer_id": run.served.path},
        }

    @app.post("/api/v1/forward_backward")
    async def forward_backward(request: Request) -> dict[str, Any]:
        if PROTO_CONTENT_TYPE not in request.headers.get("content-type", ""):
            raise Refused(415, f"forward_backward takes a {PROTO_CONTENT_TYPE} body (the tinker SDK's ForwardBackwardRequest)")
        try:
            parsed = decode_forward_backward(await request.body(), request.headers.get("content-encoding"))
        except WireError as exc:
            raise Refused(422, str(exc)) from None
        return {"request_id": service.submit(lambda: service.forward_backward(parsed)), "model_id": parsed.model_id}

    @app.post("/api/v1/optim_step")
    async def optim_step(request: Request) -> dict[str, Any]:
        import tinker.types

        parsed = await body(request, "OptimStepRequest")
        if not isinstance(parsed.optim_params, tinker.types.AdamParams):
            raise Refused(
                422, f"optim_params: {type(parsed.optim_params).__name__}; this server steps AdamW only (types.AdamParams)"
            )
        adam = parsed.optim_params.model_dump()
        return {"request_id": service.submit(lambda: service.optim_step(parsed.model_id, adam)), "model_id": parsed.model_id}

    @app.post("/api/v1/save_weights_for_sampler")
    async def save_for_sampler(request: Request) -> dict[str, Any]:
        parsed = await body(request, "SaveWeightsForSamplerRequest")
        if parsed.kind != "snapshot":
            raise Refused(422, f"kind: {parsed.kind!r}; this server saves snapshot sampling weights only so far")
        return {
            "request_id": service.submit(lambda: service.save_for_sampler(parsed.model_id, parsed.path)),
            "model_id": parsed.model_id,
        }

    @app.post("/api/v1/create_sampling_session")
    async def create_sampling_session(request: Request) -> dict[str, Any]:
        parsed = await body(request, "CreateSamplingSessionRequest")
        return {
            "type": "create_sampling_session",
            "sampling_session_id": service.open_sampler(_sampler_weights(service, parsed.model_path, parsed.base_model)),
        }

    @app.get("/api/v1/samplers/{sampling_session_id}")
    async def get_sampler(sampling_session_id: str) -> dict[str, Any]:
        weights = known(service.sampler, sampling_session_id)
        return {"sampler_id": sampling_session_id, "base_model": weights.served.name, "model_path": weights.model_path}

    @app.post("/api/v1/asample")
    async def asample(request: Request) -> dict[str, Any]:
        parsed = await body(request, "SampleRequest")
        if parsed.sampling_session_id is not None:
            weights = known(service.sampler, parsed.sampling_session_id)
        else:
            weights = _sampler_weights(service, parsed.model_path, parsed.base_model)
        wanted = _sampling_request(parsed)
        request_id = service.submit(lambda: service.sample(parsed.sampling_session_id, weights, wanted))
        return {"request_id": request_id, "sample_sequence_ids": [f"{request_id}-{i}" for i in range(parsed.num_samples)]}

    @app.post("/api/v1/retrieve_future")
    async def retrieve_future(request: Request) -> Any:
        parsed = await body(request, "FutureRetrieveRequest")
        try:
            result = await service.result_within(parsed.request_id, LONG_POLL_S)
        except KeyError:
            raise Refused(404, f"request_id {parsed.request_id!r}: no such request on this server") from None
        if result is None:
            return {"type": "try_again", "request_id": parsed.request_id, "queue_state": "active"}
        if result.proto is not None:
            return Response(result.proto, media_type=PROTO_CONTENT_TYPE)
        return JSONResponse(result.body)

    @app.api_route("/api/v1/{rest:path}", methods=["GET", "POST", "PUT", "DELETE"])
    async def not_yet(rest: str) -> None:
        raise Refused(404, f"/api/v1/{rest}: this rlhf tinker server does not serve that call yet (docs/serve.md)")

    return app


def _sampler_weights(service: TinkerService, model_path: str | None, base_model: str | None) -> SamplerWeights:
    if model_path is not None:
        if model_path not in service.saved_weights:
            raise Refused(
                404,
                f"model_path {model_path!r}: no weights saved under that path on this server "
                "(save_weights_for_sampler(name) makes one)",
            )
        return service.saved_weights[model_path]
    if base_model is None:
        raise Refused(422, "base_model or model_path: one is needed to sample")
    try:
        return SamplerWeights(service.served(base_model), None)
    except UserInputError as exc:
        raise Refused(404, str(exc)) from None


#: SampleRequest fields this server does not compute yet: refused rather than answered without them
UNSERVED_SAMPLING_FIELDS = ("topk_prompt_logprobs", "topk_sample_logprobs", "prompt_alt_tokens_k", "target_prompt_logprobs")


def _sampling_request(parsed: Any) -> SamplingRequest:
    for name in UNSERVED_SAMPLING_FIELDS:
        if getattr(parsed, name):
            raise Refused(422, f"{name}: this server does not compute it yet; leave it unset (docs/serve.md)")
    try:
        prompt = parsed.prompt.to_ints()
    except (AttributeError, ValueError):
        raise Refused(422, "prompt: this server samples from token chunks only (types.ModelInput.from_ints)") from None
    params = parsed.sampling_params
    stop = params.stop if params.stop is not None else ()
    return SamplingRequest(
        prompt=prompt,
        num_samples=parsed.num_samples,
        max_tokens=params.max_tokens or 16,
        temperature=params.temperature,
        top_k=params.top_k,
        top_p=params.top_p,
        stop=(stop,) if isinstance(stop, str) else tuple(stop),
        seed=params.seed,
        prompt_logprobs=bool(parsed.prompt_logprobs),
        prompt_logprobs_last_n=parsed.prompt_logprobs_last_n,
    )
