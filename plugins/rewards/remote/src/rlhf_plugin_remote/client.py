"""The HTTP client (see the package docstring)."""

from __future__ import annotations

import itertools
import logging
import os
import time
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field

from rlhf.errors import ConfigError, RewardSourceDown, RewardSourceError
from rlhf_plugin_remote.answer import FailedTry, read_answer

log = logging.getLogger("rlhf.rewards.remote")

#: The shared secret of a key-protected reward server (``rlhf serve reward --api_key``), sent as a Bearer token.
API_KEY_ENV = "RLHF_REWARD_API_KEY"


class RemoteOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    timeout_s: float = Field(180.0, description="timeout of one HTTP try, seconds")
    retries: int = Field(5, ge=1, description="tries per request")
    backoff_s: float = Field(1.0, ge=0, description="wait before the 2nd try; doubles after each failure")


def check_url(url: str) -> None:
    """A ConfigError naming ``--reward.remote_url`` unless ``url`` is an http(s) URL with a host."""
    example = "e.g. http://127.0.0.1:5000/get_reward"
    try:
        parts = urlsplit(url)
        host, _port = parts.hostname, parts.port  # .port raises ValueError for a port outside 0-65535
    except ValueError as exc:
        raise ConfigError(f"--reward.remote_url {url!r}: not a valid URL ({exc}); {example}") from None
    if parts.scheme not in ("http", "https"):
        raise ConfigError(f"--reward.remote_url {url!r}: does not start with http:// or https://; {example}")
    if not host:
        raise ConfigError(f"--reward.remote_url {url!r}: the URL has no host; {example}")


class RemoteReward:
    def __init__(self, urls: list[str], options: RemoteOptions | None = None) -> None:
        if not urls:
            raise ConfigError("--reward.remote_url: no URL given; e.g. http://127.0.0.1:5000/get_reward")
        for url in urls:
            check_url(url)
        self.urls, self.options = urls, options or RemoteOptions()
        self._start = itertools.cycle(range(len(urls)))

    @classmethod
    def from_config(cls, config: Any) -> RemoteReward:
        urls = [u.strip() for u in (config.reward.remote_url or "").split(",") if u.strip()]
        return cls(urls, RemoteOptions.model_validate(config.plugins.get("remote", {})))

    def __call__(self, queries: list[str], prompts: list[str], labels: list[Any], **columns: Any) -> dict[str, Any]:
        import httpx

        first = next(self._start)
        count, servers = len(queries), len(self.urls)
        chunks = [range(i * count // servers, (i + 1) * count // servers) for i in range(servers)]  # contiguous, even
        merged: dict[str, Any] = {"rewards": [], "scores": [], "extra_logs": {}}
        key = os.environ.get(API_KEY_ENV)  # a secret: read from the environment, never stored in the run's config
        headers = {"Authorization": f"Bearer {key}"} if key else None
        with httpx.Client(timeout=self.options.timeout_s, headers=headers) as client:
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
        """The server's answer; after the last try (or an answer that will not change) a RewardSourceError."""
        wait = self.options.backoff_s
        for attempt in range(1, self.options.retries + 1):
            try:
                return read_answer(self._send(client, url, body), len(body["query"]))
            except FailedTry as failure:
                if not failure.retry or attempt == self.options.retries:
                    tries = f"{attempt} {'try' if attempt == 1 else 'tries'}"
                    kind = RewardSourceDown if failure.unreachable else RewardSourceError
                    raise kind(f"remote reward {url} failed after {tries}: {failure}") from failure
                log.warning("remote reward %s: try %d failed (%s); retrying in %.1f s", url, attempt, failure, wait)
                time.sleep(wait)
                wait *= 2
        raise AssertionError("unreachable: the last try returns or raises")

    def _send(self, client: Any, url: str, body: dict[str, Any]) -> Any:
        """``client.post``, with a transport failure turned into a :class:`FailedTry` in words."""
        import httpx

        try:
            return client.post(url, json=body)
        except httpx.TimeoutException as exc:
            raise FailedTry(f"no answer within {self.options.timeout_s:g} s ({type(exc).__name__}); if the server "
                            f"is just slow, raise --remote.timeout_s", unreachable=True) from exc
        except httpx.ConnectError as exc:
            port = urlsplit(url).port
            command = f"rlhf serve reward --function NAME{f' --port {port}' if port else ''}"
            raise FailedTry(f"cannot connect ({exc}); is the server running? start it with `{command}` "
                            f"(or --model PATH)", unreachable=True) from exc
        except httpx.TransportError as exc:
            raise FailedTry(f"the connection failed ({type(exc).__name__}: {exc})", unreachable=True) from exc
