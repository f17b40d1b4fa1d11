"""The remote-reward client against real HTTP servers on loopback: healthy, slow, failing, down."""

from __future__ import annotations

import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI, Response
from rlhf_plugin_remote.client import RemoteOptions, RemoteReward

from rlhf.reward_terms import CompositeReward, TermSpec, call_reward
from rlhf.runtime.worker_group import free_port


class LoopbackServer:
    """A real uvicorn server in a thread."""

    def __init__(self, app: FastAPI) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/get_reward"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="error"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LoopbackServer:
        self.thread.start()
        deadline = time.time() + 10
        while not self.server.started:
            assert time.time() < deadline, "server did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


def reward_app(*, delay: float = 0.0, failures: int = 0, hits: list[int] | None = None) -> FastAPI:
    app = FastAPI()
    state = {"calls": 0}

    @app.post("/get_reward")
    def get_reward(body: dict, response: Response) -> dict:
        state["calls"] += 1
        if hits is not None:
            hits.append(len(body["query"]))
        if state["calls"] <= failures:
            response.status_code = 500
            return {"error": "boom"}
        time.sleep(delay)
        rewards = [float(len(q) - len(p)) for q, p in zip(body["query"], body["prompts"])]
        return {"rewards": rewards, "extra_logs": {"served": [1.0] * len(rewards)}}

    return app


QUERIES, PROMPTS, LABELS = ["Q:a", "Q:bb", "Q:ccc", "Q:dddd"], ["Q:"] * 4, ["1", "2", "3", "4"]
FAST = RemoteOptions(timeout_s=2.0, retries=3, backoff_s=0.05)


def test_round_robin_over_two_servers() -> None:
    first, second = [], []
    with LoopbackServer(reward_app(hits=first)) as a, LoopbackServer(reward_app(hits=second)) as b:
        out = call_reward(RemoteReward([a.url, b.url], FAST), QUERIES, PROMPTS, LABELS, source="remote")
    assert out.rewards == [1.0, 2.0, 3.0, 4.0] and out.scores == out.rewards
    assert out.extra_logs == {"served": 1.0}
    assert first == [2] and second == [2]


def test_500s_are_retried_until_the_server_recovers() -> None:
    with LoopbackServer(reward_app(failures=2)) as server:
        out = call_reward(RemoteReward([server.url], FAST), QUERIES, PROMPTS, LABELS, source="remote")
    assert out.rewards == [1.0, 2.0, 3.0, 4.0]


def test_a_server_that_keeps_failing_raises_after_the_retries() -> None:
    with LoopbackServer(reward_app(failures=100)) as server:
        with pytest.raises(RuntimeError, match="failed 3 times; last error: HTTPStatusError"):
            RemoteReward([server.url], FAST)(QUERIES, PROMPTS, LABELS)


def test_a_slow_server_times_out() -> None:
    options = RemoteOptions(timeout_s=0.3, retries=2, backoff_s=0.0)
    with LoopbackServer(reward_app(delay=1.5)) as server:
        started = time.perf_counter()
        with pytest.raises(RuntimeError, match="failed 2 times; last error: ReadTimeout"):
            RemoteReward([server.url], options)(QUERIES, PROMPTS, LABELS)
    assert time.perf_counter() - started < 3.0


def test_a_down_server_becomes_zero_rewards_under_the_zero_policy() -> None:
    down = f"http://127.0.0.1:{free_port()}/get_reward"  # nothing listens there
    remote = RemoteReward([down], RemoteOptions(timeout_s=0.5, retries=2, backoff_s=0.0))
    composite = CompositeReward([(TermSpec("remote_http", 1.0, "zero"),
                                  lambda q, p, labels, **c: call_reward(remote, q, p, labels, source="remote"))])
    out = composite(QUERIES, PROMPTS, LABELS)
    assert out.rewards == [0.0] * 4 and out.logs["reward_failures/remote_http"] == 4.0
    with pytest.raises(RuntimeError, match="ConnectError"):
        remote(QUERIES, PROMPTS, LABELS)
