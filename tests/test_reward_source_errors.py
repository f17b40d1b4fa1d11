"""Broken reward sources as a user meets them: one `rlhf: error:` line from the real command, and
`rlhf serve reward`'s JSON refusals (raising or NaN rewards, oversized or malformed bodies) on loopback."""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from pathlib import Path

import httpx
import pytest
import uvicorn
from rlhf_plugin_reward_server.server import build_app

from rlhf.distributed import free_port
from rlhf.testing.cli import assert_user_error, run_rlhf

# ----------------------------------------------------------------- the rlhf command


@pytest.fixture(scope="module")
def ppo_flags(tmp_path_factory: pytest.TempPathFactory, tiny_causal_lm_path: Path) -> list[str]:
    """Flags of a real PPO run, short of the reward: the reward stage is built before Ray or DeepSpeed start."""
    prompts = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    prompts.write_text(json.dumps({"input": "what is 1+1?", "label": "2"}) + "\n")
    return ["train", "ppo", "--actor.model_name_or_path", str(tiny_causal_lm_path),
            "--data.prompt_dataset", str(prompts), "--data.label_key", "label"]


@pytest.mark.parametrize(("source", "names"), [
    ("def reward_func(queries, prompts, labels):\n    return [1.0 for q in queries\n", ["line 2", "syntax error"]),
    ("import json\nimport no_such_reward_helper\n", ["line 2", "ModuleNotFoundError", "no_such_reward_helper"]),
    ("def reward_fn(queries, prompts, labels):\n    return [0.0] * len(queries)\n",
     ["defines no reward_func", "Did you mean 'reward_fn'?"]),
])
def test_a_broken_reward_file_stops_ppo_at_start_with_one_line(tmp_path: Path, ppo_flags: list[str], source: str,
                                                               names: list[str]) -> None:
    reward = tmp_path / "my_reward.py"
    reward.write_text(source)
    result = run_rlhf(*ppo_flags, "--reward.remote_url", str(reward), "--ckpt.output_dir", str(tmp_path / "out"))
    assert_user_error(result, str(reward), *names)


def test_a_missing_reward_file_stops_ppo_at_start(tmp_path: Path, ppo_flags: list[str]) -> None:
    missing = tmp_path / "rewards" / "nope.py"
    result = run_rlhf(*ppo_flags, "--reward.remote_url", str(missing), "--ckpt.output_dir", str(tmp_path / "out"))
    assert_user_error(result, "--reward.remote_url", str(missing), "no such file")


def test_a_remote_url_without_a_host_stops_ppo_at_start(tmp_path: Path, ppo_flags: list[str]) -> None:
    result = run_rlhf(*ppo_flags, "--reward.remote_url", "http:///get_reward", "--ckpt.output_dir", str(tmp_path / "out"))
    assert_user_error(result, "--reward.remote_url", "'http:///get_reward'", "has no host")


def test_serving_an_unknown_function_names_the_flag() -> None:
    assert_user_error(run_rlhf("serve", "reward", "--function", "math_answr"), "--function", "'math_answr'",
                      "Did you mean 'math_answer'?")


def test_serving_a_model_dir_that_does_not_exist_names_the_flag(tmp_path: Path) -> None:
    missing = tmp_path / "no" / "such" / "rm"
    assert_user_error(run_rlhf("serve", "reward", "--model", str(missing)), "--model", str(missing), "no such model directory")


# ----------------------------------------------------------------- the reward server


def reward(queries: list[str], prompts: list[str], labels: list[str], **kwargs: object) -> list[float]:
    """1.0 per query, except the queries that make it raise or return NaN / infinity."""
    if "boom" in queries:
        raise ValueError(f"cannot score {queries.index('boom')}")
    return [{"nan": math.nan, "inf": math.inf}.get(q, 1.0) for q in queries]


@pytest.fixture(scope="module")
def server_url() -> str:
    """``reward`` behind the real app on a real uvicorn server, with a 1000-byte request limit."""
    app = build_app(reward, "probe", "reward function 'probe'", max_request_bytes=1000)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 10
    while not server.started:
        assert time.time() < deadline, "server did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}/get_reward"
    server.should_exit = True
    thread.join(timeout=10)


def test_the_server_answers_the_protocol(server_url: str) -> None:
    answer = httpx.post(server_url, json={"query": ["a", "b"], "prompts": ["", ""], "labels": ["1", "2"]})
    assert answer.status_code == 200 and answer.json() == {"rewards": [1.0, 1.0], "scores": [1.0, 1.0], "extra_logs": {}}


def test_a_raising_reward_is_a_500_with_the_reason(server_url: str) -> None:
    answer = httpx.post(server_url, json={"query": ["a", "boom"]})
    assert answer.status_code == 500
    assert answer.json() == {"error": "reward function 'probe' raised ValueError: cannot score 1"}


@pytest.mark.parametrize(("query", "value"), [("nan", "nan"), ("inf", "inf")])
def test_a_non_finite_reward_is_a_500_naming_the_function_and_the_sample(server_url: str, query: str, value: str) -> None:
    answer = httpx.post(server_url, json={"query": ["a", query]})
    assert answer.status_code == 500
    assert answer.json()["error"].startswith(f"reward function 'probe' returned non-finite reward {value} / score {value} "
                                             "for sample 1; JSON cannot carry NaN or infinity")


@pytest.mark.parametrize(("body", "reason"), [
    (b'{"query": "one string"}', "query: Input should be a valid array"),
    (b'{"prompts": ["a"]}', "query: Field required"),
    (b'{"query": ["a", 2]}', "query.1: Input should be a valid string"),
    (b"query=a", "body: Invalid JSON"),
])
def test_a_body_outside_the_protocol_is_a_422_that_says_why(server_url: str, body: bytes, reason: str) -> None:
    answer = httpx.post(server_url, content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 422
    error = answer.json()["error"]
    assert error.startswith("the request body does not fit the protocol {\"query\": [str]") and reason in error


def test_lists_of_different_lengths_are_a_422(server_url: str) -> None:
    answer = httpx.post(server_url, json={"query": ["a", "b"], "labels": ["1"]})
    assert answer.status_code == 422
    assert answer.json() == {"error": "'labels' has 1 items for 2 queries; query, prompts and labels must have the same length"}


def test_a_body_over_the_limit_is_a_413_by_its_content_length(server_url: str) -> None:
    body = json.dumps({"query": ["x" * 2000]}).encode()
    answer = httpx.post(server_url, content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 413
    assert answer.json()["error"].startswith(f"the request body of {len(body)} bytes is over this server's limit of "
                                             "1000 bytes (--max_request_bytes)")


def test_a_chunked_body_over_the_limit_is_a_413_while_it_streams(server_url: str) -> None:
    def chunks():  # no Content-Length: httpx sends a generator with Transfer-Encoding: chunked
        for _ in range(10_000):
            yield b"x" * 100

    answer = httpx.post(server_url, content=chunks())
    assert answer.request.headers["Transfer-Encoding"] == "chunked"
    assert answer.status_code == 413
    assert answer.json()["error"].startswith("the request body is over this server's limit of 1000 bytes")


FIFTY_MIB = 50 * 1024 * 1024


def post_slowly(url: str, body: bytes, seconds: float) -> tuple[int, dict[str, str], bytes]:
    """POST ``body`` with its Content-Length over a plain socket, spread over ``seconds`` (a slow link or a busy
    client), then read the answer until the server closes: (status, headers, payload)."""
    where = urllib.parse.urlsplit(url)
    with socket.create_connection((where.hostname, where.port), timeout=30) as conn:
        conn.sendall(f"POST {where.path} HTTP/1.1\r\nHost: {where.netloc}\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n\r\n".encode())
        pieces = 50
        step = -(-len(body) // pieces)
        for start in range(0, len(body), step):
            conn.sendall(body[start:start + step])
            time.sleep(seconds / pieces)
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    status_line, *lines = head.decode().split("\r\n")
    headers = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines)}
    return int(status_line.split()[1]), headers, payload


@pytest.mark.slow
def test_a_fifty_mib_body_sent_slowly_gets_the_413_not_a_reset(server_url: str) -> None:
    """The server knows the answer from the headers while the client has ~6 s of body left to send (longer than
    uvicorn's keep-alive wait): the client still gets the whole 413, then the server closes the connection."""
    body = b'{"query": ["' + b"x" * FIFTY_MIB + b'"]}'
    status, headers, payload = post_slowly(server_url, body, seconds=6.0)
    assert status == 413 and headers["connection"] == "close"
    assert "over this server's limit of 1000 bytes (--max_request_bytes)" in json.loads(payload)["error"]


def test_a_fifty_mib_chunked_body_gets_the_413_and_a_closed_connection(server_url: str) -> None:
    chunks = (b"x" * 2**20 for _ in range(50))  # no Content-Length: the limit is found while it streams
    answer = httpx.post(server_url, content=chunks, headers={"Content-Type": "application/json"}, timeout=60)
    assert answer.status_code == 413 and answer.headers["connection"] == "close"
    assert answer.json()["error"].startswith("the request body is over this server's limit of 1000 bytes")


def test_the_command_line_sets_the_request_limit() -> None:
    port = free_port()
    command = [sys.executable, "-m", "rlhf", "serve", "reward", "--function", "math_answer", "--port", str(port),
               "--max_request_bytes", "100"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ})
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 60
        while True:
            assert process.poll() is None, process.stderr.read()
            assert time.time() < deadline, "server did not become healthy"
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        small = httpx.post(f"{base}/get_reward", json={"query": ["Q: 2"], "labels": ["2"]})
        large = httpx.post(f"{base}/get_reward", json={"query": ["Q: 2" * 50], "labels": ["2"]})
    finally:
        process.terminate()
        process.wait(timeout=20)
    assert small.status_code == 200 and large.status_code == 413
    assert "limit of 100 bytes (--max_request_bytes)" in large.json()["error"]
