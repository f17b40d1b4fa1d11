"""What the remote-reward client says when a real loopback server is down, slow or answers garbage."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from rlhf_plugin_remote.client import RemoteOptions, RemoteReward

from rlhf.distributed import free_port
from rlhf.errors import ConfigError, RewardSourceError

QUERIES, PROMPTS, LABELS = ["Q:a", "Q:bb", "Q:ccc", "Q:dddd"], ["Q:"] * 4, ["1", "2", "3", "4"]
TWO_TRIES = RemoteOptions(timeout_s=2.0, retries=2, backoff_s=0.0)


class CannedServer:
    """A real HTTP server on loopback that answers every POST with one status and body, and counts the requests."""

    def __init__(self, status: int, body: bytes, delay_s: float = 0.0) -> None:
        self.requests = 0
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the name http.server calls
                self.rfile.read(int(self.headers["Content-Length"]))
                server.requests += 1
                time.sleep(delay_s)
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: object) -> None:  # keep the test output clean
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_port}/get_reward"

    def __enter__(self) -> CannedServer:
        threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def failure(server_url: str, options: RemoteOptions = TWO_TRIES) -> str:
    with pytest.raises(RewardSourceError) as caught:
        RemoteReward([server_url], options)(QUERIES, PROMPTS, LABELS)
    message = str(caught.value)
    assert message.startswith(f"remote reward {server_url} failed after ")
    return message


def test_a_down_server_asks_whether_it_is_running() -> None:
    port = free_port()  # nothing listens there
    message = failure(f"http://127.0.0.1:{port}/get_reward")
    assert "failed after 2 tries: cannot connect" in message and "Connection refused" in message
    assert f"is the server running? start it with `rlhf serve reward --function NAME --port {port}`" in message


def test_a_slow_server_names_the_timeout_and_its_flag() -> None:
    with CannedServer(200, b'{"rewards": [0, 0, 0, 0]}', delay_s=1.0) as server:
        started = time.perf_counter()
        message = failure(server.url, RemoteOptions(timeout_s=0.2, retries=2, backoff_s=0.0))
        assert time.perf_counter() - started < 1.0
    assert "no answer within 0.2 s (ReadTimeout)" in message and "--remote.timeout_s" in message


@pytest.mark.parametrize(("status", "body", "reason"), [
    (500, {"error": "reward function 'math' raised ValueError: bad label"},
     "answered HTTP 500 Internal Server Error: reward function 'math' raised ValueError: bad label"),
    (503, b"<html><body>upstream unavailable</body></html>",
     "answered HTTP 503 Service Unavailable: '<html><body>upstream unavailable</body></html>'"),
    (429, {"detail": "slow down"}, "answered HTTP 429 Too Many Requests: slow down"),
    (200, b"<html>" + b"x" * 200 + b"</html>",
     "answered HTTP 200 with a body that is not JSON: '<html>" + "x" * 74 + "…'"),
    (200, {"reward": [1, 2, 3, 4], "scores": [1, 2, 3, 4]}, "answered JSON without 'rewards' (keys: reward, scores); the protocol's answer is "
     '{"rewards": [...], "scores": [...]?, "extra_logs": {...}?}'),
    (200, [1, 2, 3, 4], "answered JSON that is not an object: '[1, 2, 3, 4]'"),
    (200, {"rewards": [1.0, 2.0]}, "answered 2 rewards for 4 samples"),
    (200, {"rewards": [1.0, "high", 0.0, 0.0]}, "answered rewards that are not all numbers, e.g. '\"high\"'"),
    (200, {"rewards": [1, 2, 3, 4], "scores": [1, 2, None, 4]}, "answered scores that are not all numbers, e.g. 'null'"),
])
def test_an_unusable_answer_is_retried_then_named(status: int, body: object, reason: str) -> None:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    with CannedServer(status, raw) as server:
        message = failure(server.url)
    assert message == f"remote reward {server.url} failed after 2 tries: {reason}"
    assert server.requests == 2


@pytest.mark.parametrize("status", [400, 404, 413, 422])
def test_a_client_error_is_not_retried(status: int) -> None:
    with CannedServer(status, b'{"error": "the request body is over this server\'s limit"}') as server:
        message = failure(server.url, RemoteOptions(timeout_s=2.0, retries=5, backoff_s=0.0))
    assert server.requests == 1
    assert f"failed after 1 try: answered HTTP {status} " in message and "over this server's limit" in message


def test_a_wrong_path_is_suggested_on_a_404() -> None:
    with CannedServer(404, b'{"detail": "Not Found"}') as server:
        message = failure(server.url)
    assert message.endswith("answered HTTP 404 Not Found: Not Found; check the URL's path "
                            "(`rlhf serve reward` answers POST /get_reward)")


def test_an_empty_error_body_is_said_to_be_empty() -> None:
    with CannedServer(502, b"") as server:
        assert failure(server.url).endswith("answered HTTP 502 Bad Gateway: (empty body)")


def test_a_good_answer_after_the_checks_still_reaches_the_rewards() -> None:
    with CannedServer(200, b'{"rewards": [1, 2.5, 0, -1], "extra_logs": {"served": 1}}') as server:
        out = RemoteReward([server.url], TWO_TRIES)(QUERIES, PROMPTS, LABELS)
    assert out["rewards"] == [1, 2.5, 0, -1] and out["extra_logs"] == {"served": [1]}


@pytest.mark.parametrize(("url", "reason"), [
    ("http:///get_reward", "the URL has no host"),
    ("http://", "the URL has no host"),
    ("ftp://127.0.0.1/get_reward", "does not start with http:// or https://"),
    ("127.0.0.1:5000/get_reward", "does not start with http:// or https://"),
    ("http://127.0.0.1:port/get_reward", "not a valid URL"),
])
def test_a_malformed_url_is_a_config_error_at_construction(url: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        RemoteReward(["http://127.0.0.1:5000/get_reward", url])
    assert str(caught.value).startswith(f"--reward.remote_url {url!r}: {reason}")
