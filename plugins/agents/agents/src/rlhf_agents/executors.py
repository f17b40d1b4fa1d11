"""The rollout engines as agent executors see them: one ``await generate(...)`` per model turn.

Many episodes run at once on one event loop in the controller. Their turns are gathered into
batches: every request made while the engines are busy (or in the same loop tick) goes out
in the next :meth:`RolloutEngines.generate` call, so the engines see batches of turns from
many episodes, never one sequence at a time. Runs in the controller, one client per rollout batch.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from rlhf.deprecation import deprecated_names
from rlhf.models.loading import load_tokenizer

__all__ = ["SAMPLING_FIELDS", "turn_sampling", "UnsupportedSampling", "AsyncAgentExecutor", "EngineClient", "VLLMStyleEngine"]

# plugin API 2 had run_processor here (rlhf.agents.executors); plugin API 3 moved it to rlhf.run_context
__getattr__ = deprecated_names(__name__, {"run_processor": ("rlhf.run_context:run_processor", "rlhf-core 0.5 (plugin API 5)")})

#: The sampling fields an agent may set per turn; every engine honours them.
SAMPLING_FIELDS = ("max_tokens", "temperature", "top_p")
#: Fields that may carry any value because the runtime sets them itself (seed per turn, log-probs always returned).
_RUNTIME_FIELDS = frozenset({"seed", "logprobs", "n", "detokenize", "skip_special_tokens", "output_kind"})


def turn_sampling(params: Any, source: str) -> dict[str, Any]:
    """``max_tokens``/``temperature``/``top_p`` of an agent's per-turn sampling parameters (a dict, or an
    object such as vLLM's ``SamplingParams``); None where not set.

    Any other field set to something the engines would have to honour (``stop``, ``top_k``, a penalty…)
    raises :class:`UnsupportedSampling` naming ``source`` and the field: a turn is never sampled other
    than the agent asked without saying so. Fields of an object count as set when they differ from the
    object type's own defaults. Runs in the controller, once per model turn.
    """
    if params is None:
        return {}
    if isinstance(params, dict):
        values = {key: value for key, value in params.items() if value is not None}
    else:
        names = getattr(type(params), "__struct_fields__", None) or list(vars(params))
        try:
            defaults = type(params)()
        except Exception:  # noqa: BLE001 - a type without a no-argument form: every field counts as set
            defaults = None
        values = {name: getattr(params, name) for name in names
                  if getattr(params, name, None) is not None
                  and (defaults is None or name in SAMPLING_FIELDS or getattr(defaults, name, None) != getattr(params, name))}
    unsupported = sorted(key for key in values if key not in SAMPLING_FIELDS and key not in _RUNTIME_FIELDS)
    if unsupported:
        raise UnsupportedSampling(f"{source} sets sampling parameter(s) {', '.join(unsupported)}, which the rollout "
                                  f"engines do not apply per turn (supported: {', '.join(SAMPLING_FIELDS)}); remove them")
    return {key: values[key] for key in SAMPLING_FIELDS if key in values}


class UnsupportedSampling(ValueError):
    """An agent asked for a sampling parameter the engines cannot apply (the message names it)."""


class AsyncAgentExecutor:
    """Base of agent executors whose episodes are coroutines (``multi_turn``, ``openai_server``).

    A subclass implements ``async run_async(requests, engines, sampling)`` (same arguments and result
    as the executor contract's ``run``, see docs/plugins/agent-executor.md); :meth:`run` runs it on a
    fresh event loop, so every episode of the batch runs concurrently there. :attr:`tokenizer` is the
    policy's tokenizer, loaded on first use (the controller builds executors before any tokenizer is
    needed). Runs in the controller; ``run`` once per rollout batch.
    """

    provides_rewards = True  # the environments' results are the run's rewards (--reward.on_error applies)

    def __init__(self, tokenizer_path: str) -> None:
        self.tokenizer_path = tokenizer_path
        self._tokenizer: Any = None

    @property
    def tokenizer(self) -> Any:
        if self._tokenizer is None:

            self._tokenizer = load_tokenizer(self.tokenizer_path, "--actor.model_name_or_path")
        return self._tokenizer

    def run(self, requests: list[dict[str, Any]], engines: Any, sampling: dict[str, float]) -> list[dict[str, Any]]:
        return asyncio.run(self.run_async(requests, engines, sampling))

    async def run_async(self, requests: list[dict[str, Any]], engines: Any,
                        sampling: dict[str, float]) -> list[dict[str, Any]]:
        """One trajectory dict per request, in order (see :meth:`run`)."""
        raise NotImplementedError(f"{type(self).__name__} must define async run_async(requests, engines, sampling)")


class EngineClient:
    """Async, batching front of :class:`rlhf.runtime.rollout.engines.RolloutEngines`.

    ``sampling`` holds the run's ``temperature`` and ``top_p``; a request may override them
    (requests with different values go out in separate engine calls).
    """

    def __init__(self, engines: Any, sampling: dict[str, float], max_len: int) -> None:
        self.engines, self.sampling, self.max_len = engines, sampling, max_len
        self._pending: list[tuple[dict[str, Any], asyncio.Future]] = []
        self._dispatcher: asyncio.Task | None = None
        self.engine_calls = 0

    async def generate(self, prompt_ids: list[int], max_tokens: int, seed: int, temperature: float | None = None,
                       top_p: float | None = None) -> dict[str, Any]:
        """One model turn: ``{"response_ids", "logprobs", "finish_reason"}`` for ``prompt_ids``; at most
        ``max_tokens`` tokens and never past ``max_len`` (the engines' context) in all."""
        return await self.generate_multimodal(prompt_ids, None, max_tokens, seed, temperature, top_p)

    async def generate_multimodal(self, prompt_ids: list[int], media: dict[str, Any] | None, max_tokens: int, seed: int,
                                  temperature: float | None = None, top_p: float | None = None) -> dict[str, Any]:
        """:meth:`generate` for a VLM policy: ``media`` holds the images of every image token in ``prompt_ids``,
        in the processor's layout (see :func:`rlhf.media.collate_media`), or None."""
        max_tokens = min(int(max_tokens), self.max_len - len(prompt_ids))
        if max_tokens <= 0:
            return {"response_ids": [], "logprobs": [], "finish_reason": "length"}
        request = {"prompt_ids": list(prompt_ids), "max_tokens": max_tokens, "seed": int(seed),
                   "temperature": self.sampling["temperature"] if temperature is None else float(temperature),
                   "top_p": self.sampling["top_p"] if top_p is None else float(top_p), "media": media}
        future = asyncio.get_running_loop().create_future()
        self._pending.append((request, future))
        if self._dispatcher is None or self._dispatcher.done():
            self._dispatcher = asyncio.create_task(self._dispatch())
        return await future

    async def _dispatch(self) -> None:
        while self._pending:
            await asyncio.sleep(0)  # let every episode that is ready submit its turn first
            batch, self._pending = self._pending, []
            by_sampling: dict[tuple[float, float], list[tuple[dict[str, Any], asyncio.Future]]] = {}
            for request, future in batch:
                by_sampling.setdefault((request["temperature"], request["top_p"]), []).append((request, future))
            for (temperature, top_p), items in by_sampling.items():
                try:
                    results = await asyncio.to_thread(self.engines.generate, [r for r, _ in items], temperature, top_p)
                except BaseException as exc:  # noqa: BLE001 - every waiting episode gets the engine's error
                    for _, future in items:
                        if not future.done():
                            future.set_exception(exc)
                    continue
                self.engine_calls += 1
                for (_, future), result in zip(items, results):
                    if not future.done():
                        future.set_result(result)


class VLLMStyleEngine:
    """The ``llm_engine`` an OpenRLHF ``AgentExecutor`` awaits: ``generate(prompt_token_ids, sampling_params)``
    returns an object shaped like vLLM's ``RequestOutput`` (``outputs[0].token_ids``, ``.logprobs``,
    ``.finish_reason``)."""

    #: the prompt's images (a VLM prompt's media, see :func:`rlhf.media.collate_media`), sent with every
    #: call: the episode's token ids start with the prompt's, image tokens included. Set by the executor.
    media: dict[str, Any] | None = None

    def __init__(self, client: EngineClient, max_tokens: int, seed: int) -> None:
        self.client, self.max_tokens, self.seed, self.calls = client, max_tokens, seed, 0

    async def generate(self, prompt_token_ids: list[int], sampling_params: Any = None, multi_modal_data: Any = None) -> Any:
        params = turn_sampling(sampling_params, "AgentExecutor's llm_engine.generate(sampling_params=...)")
        given = len((multi_modal_data or {}).get("image") or [])
        if given != len((self.media or {}).get("images") or []) and multi_modal_data is not None:
            raise ValueError(f"llm_engine.generate(multi_modal_data=...) passes {given} image(s), but only the prompt's own "
                             f"{len((self.media or {}).get('images') or [])} can be sent; images an environment adds go "
                             "through AgentInstance.step's environment_images")
        self.calls += 1
        out = await self.client.generate_multimodal(prompt_token_ids, self.media, params.get("max_tokens") or self.max_tokens,
                                                    self.seed + 7919 * self.calls, params.get("temperature"), params.get("top_p"))
        logprobs = [{token: SimpleNamespace(logprob=lp)} for token, lp in zip(out["response_ids"], out["logprobs"])]
        completion = SimpleNamespace(token_ids=out["response_ids"], logprobs=logprobs, finish_reason=out["finish_reason"],
                                     text=None)
        return SimpleNamespace(prompt_token_ids=list(prompt_token_ids), outputs=[completion])
