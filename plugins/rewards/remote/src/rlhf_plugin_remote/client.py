"""The HTTP client (see the package docstring)."""

from __future__ import annotations

import itertools
import logging
import time
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger("rlhf.rewards.remote")


class RemoteOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    timeout_s: float = Field(180.0, description="timeout of one HTTP try, seconds")
    retries: int = Field(5, ge=1, description="tries per request")
    backoff_s: float = Field(1.0, ge=0, description="wait before the 2nd try; doubles after each failure")


class RemoteReward:
    def __init__(self, urls: list[str], options: RemoteOptions | None = None) -> None:
        if not urls:
            raise ValueError("--reward.remote_url: no URL given")
        self.urls, self.options = urls, options or RemoteOptions()
        self._start = itertools.cycle(range(len(urls)))

    @classmethod
    def from_config(cls, config: Any) -> RemoteReward:
        urls = [u.strip() for u in (config.reward.remote_url or "").split(",") if u.strip()]
        return cls(urls, RemoteOptions.model_validate(config.plugins.get("remote", {})))

    def __call__(self, queries: list[str], prompts: list[str], labels: list[Any], **columns: Any) -> dict[str, Any]:
        import httpx

        from rlhf.runtime.worker_group import split_evenly

        first = next(self._start)
        chunks = split_evenly(list(range(len(queries))), len(self.urls))
        merged: dict[str, Any] = {"rewards": [], "scores": [], "extra_logs": {}}
        with httpx.Client(timeout=self.options.timeout_s) as client:
            for offset, rows in enumerate(chunks):
                if not rows:
                    continue
                url = self.urls[(first + offset) % len(self.urls)]
                body = {"query": [queries[i] for i in rows], "prompts": [prompts[i] for i in rows],
                        "labels": [str(labels[i]) for i in rows]}
                answer = self._post(client, url, body)
                rewards = answer["rewards"]
                merged["rewards"] += rewards
                merged["scores"] += answer.get("scores") or rewards
                for key, value in (answer.get("extra_logs") or {}).items():
                    merged["extra_logs"].setdefault(key, []).extend(value if isinstance(value, list) else [value])
        return merged

    def _post(self, client: Any, url: str, body: dict[str, Any]) -> dict[str, Any]:
        import httpx

        wait = self.options.backoff_s
        for attempt in range(1, self.options.retries + 1):
            try:
                response = client.post(url, json=body)
                response.raise_for_status()
                return response.json()
            except (httpx.HTTPError, ValueError) as exc:
                if attempt == self.options.retries:
                    raise RuntimeError(f"remote reward {url} failed {attempt} times; last error: {type(exc).__name__}: {exc}") from exc
                log.warning("remote reward %s: try %d failed (%s); retrying in %.1f s", url, attempt, exc, wait)
                time.sleep(wait)
                wait *= 2
        raise AssertionError("unreachable")

