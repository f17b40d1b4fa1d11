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


class EngineClient:
    """Async, batching front of :class:`rlhf.runtime.rollout.RolloutEngines`.

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
        max_tokens = min(int(max_tokens), self.max_len - len(prompt_ids))
        if max_tokens <= 0:
            return {"response_ids": [], "logprobs": [], "finish_reason": "length"}
        request = {"prompt_ids": list(prompt_ids), "max_tokens": max_tokens, "seed": int(seed),
                   "temperature": self.sampling["temperature"] if temperature is None else float(temperature),
                   "top_p": self.sampling["top_p"] if top_p is None else float(top_p)}
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

    def __init__(self, client: EngineClient, max_tokens: int, seed: int) -> None:
        self.client, self.max_tokens, self.seed, self.calls = client, max_tokens, seed, 0

    async def generate(self, prompt_token_ids: list[int], sampling_params: Any = None, multi_modal_data: Any = None) -> Any:
        def param(name: str) -> Any:
            if isinstance(sampling_params, dict):
                return sampling_params.get(name)
            return getattr(sampling_params, name, None)

        self.calls += 1
        out = await self.client.generate(prompt_token_ids, param("max_tokens") or self.max_tokens,
                                         self.seed + 7919 * self.calls, param("temperature"), param("top_p"))
        logprobs = [{token: SimpleNamespace(logprob=lp)} for token, lp in zip(out["response_ids"], out["logprobs"])]
        completion = SimpleNamespace(token_ids=out["response_ids"], logprobs=logprobs, finish_reason=out["finish_reason"],
                                     text=None)
        return SimpleNamespace(prompt_token_ids=list(prompt_token_ids), outputs=[completion])
