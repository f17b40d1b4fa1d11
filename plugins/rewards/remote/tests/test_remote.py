"""The remote-reward client against real HTTP servers on loopback: healthy, slow, failing, down."""

from __future__ import annotations

import threading
import time

import pytest
import uvicorn
from fastapi import FastAPI, Response
from rlhf_plugin_remote.client import RemoteOptions, RemoteReward
from rlhf_plugin_reward_server.server import build_app
from rlhf_plugin_weighted_rewards.terms import CompositeReward, TermSpec

from rlhf.distributed import free_port
from rlhf.errors import RewardSourceError, find_user_error
from rlhf.reward_terms import call_reward
from rlhf.testing.conformance import RewardFunctionKit


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


def reward_app(*, delay: float = 0.0, failures: int = 0, hits: list[int] | None = None, refuse: str | None = None) -> FastAPI:
    """Rewards len(query) - len(prompt); the first ``failures`` calls, and any batch with ``refuse`` in a query, get a 500."""
    app = FastAPI()
    state = {"calls": 0}

    @app.post("/get_reward")
    def get_reward(body: dict, response: Response) -> dict:
        state["calls"] += 1
        if hits is not None:
            hits.append(len(body["query"]))
        if state["calls"] <= failures or (refuse and any(refuse in q for q in body["query"])):
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
        with pytest.raises(RewardSourceError, match="failed after 3 tries: answered HTTP 500 Internal Server Error: boom"):
            RemoteReward([server.url], FAST)(QUERIES, PROMPTS, LABELS)


def test_a_slow_server_times_out() -> None:
    options = RemoteOptions(timeout_s=0.3, retries=2, backoff_s=0.0)
    with LoopbackServer(reward_app(delay=1.5)) as server:
        started = time.perf_counter()
        with pytest.raises(RewardSourceError, match=r"failed after 2 tries: no answer within 0.3 s \(ReadTimeout\)"):
            RemoteReward([server.url], options)(QUERIES, PROMPTS, LABELS)
    assert time.perf_counter() - started < 3.0


def test_a_failing_sample_becomes_a_zero_reward_under_the_zero_policy() -> None:
    with LoopbackServer(reward_app(refuse="ccc")) as server:
        remote = RemoteReward([server.url], RemoteOptions(timeout_s=2.0, retries=1, backoff_s=0.0))
        composite = CompositeReward([(TermSpec("remote_http", 1.0, "zero"),
                                      lambda q, p, labels, **c: call_reward(remote, q, p, labels, source="remote"))])
        out = composite(QUERIES, PROMPTS, LABELS)
    assert out.rewards == [1.0, 2.0, 0.0, 4.0] and out.logs["reward_failures/remote_http"] == 1.0


def test_under_the_raise_policy_the_cli_finds_the_url_and_the_reason_in_the_chain() -> None:
    down = f"http://127.0.0.1:{free_port()}/get_reward"
    remote = RemoteReward([down], RemoteOptions(timeout_s=0.5, retries=1, backoff_s=0.0))
    composite = CompositeReward([(TermSpec("remote_http", 1.0, "raise"),
                                  lambda q, p, labels, **c: call_reward(remote, q, p, labels, source="remote"))])
    with pytest.raises(Exception) as caught:
        composite(QUERIES, PROMPTS, LABELS)
    found = find_user_error(caught.value)
    assert isinstance(found, RewardSourceError) and down in str(found) and "is the server running?" in str(found)


def test_the_error_a_reward_server_reports_reaches_the_client() -> None:
    def failing(queries, prompts, labels, **kwargs):
        raise ValueError(f"cannot parse {queries[0]!r}")

    app = build_app(failing, "failing", "reward function 'failing'")
    with LoopbackServer(app) as server, pytest.raises(RewardSourceError) as caught:
        RemoteReward([server.url], RemoteOptions(timeout_s=2.0, retries=2, backoff_s=0.0))(QUERIES, PROMPTS, LABELS)
    assert str(caught.value) == (f"remote reward {server.url} failed after 2 tries: answered HTTP 500 Internal Server "
                                 f"Error: reward function 'failing' raised ValueError: cannot parse 'Q:a'")


class TestRemoteRewardContract(RewardFunctionKit):
    """The reward-function kit against a real loopback server (one for the whole class)."""

    plugin_module, registered_name = "rlhf_plugin_remote", "remote_http"

    @classmethod
    def setup_class(cls) -> None:
        cls.server = LoopbackServer(reward_app()).__enter__()

    @classmethod
    def teardown_class(cls) -> None:
        cls.server.__exit__(None, None, None)

    def make_component(self) -> RemoteReward:
        return RemoteReward([self.server.url], FAST)


def test_the_client_sends_the_api_key_of_its_environment(monkeypatch) -> None:
    """A key-protected `rlhf serve reward`: the run's key (RLHF_REWARD_API_KEY, never stored in the run's config)
    opens it; without it the 401 is a RewardSourceError that says which variable to set, after one try."""
    app = build_app(lambda queries, prompts, labels, **_: [float(len(q)) for q in queries], "length", api_key="k3y")
    with LoopbackServer(app) as server:
        monkeypatch.delenv("RLHF_REWARD_API_KEY", raising=False)
        hits = RemoteReward([server.url], RemoteOptions(retries=3, backoff_s=0))
        with pytest.raises(RewardSourceError, match=r"failed after 1 try: answered HTTP 401.*RLHF_REWARD_API_KEY"):
            hits(["abc"], [""], [""])
        monkeypatch.setenv("RLHF_REWARD_API_KEY", "k3y")
        assert RemoteReward([server.url])(["abc", "a"], ["", ""], ["", ""])["rewards"] == [3.0, 1.0]
