"""`rlhf serve reward`: a real server process answering OpenRLHF's protocol on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest

from rlhf.runtime.cluster.liveness import free_port


@pytest.fixture
def served(request):
    def start(*args: str) -> str:
        port = free_port()
        process = subprocess.Popen([sys.executable, "-m", "rlhf", "serve", "reward", *args, "--port", str(port)],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ})
        request.addfinalizer(lambda: (process.terminate(), process.wait(timeout=20)))
        base = f"http://127.0.0.1:{port}"
        deadline = time.time() + 120
        while time.time() < deadline:
            try:
                if httpx.get(f"{base}/health", timeout=1).status_code == 200:
                    return base
            except httpx.HTTPError:
                time.sleep(0.2)
            assert process.poll() is None, process.stderr.read()
        raise AssertionError("server did not become healthy")

    return start


def test_serves_a_registered_reward_function(served) -> None:
    base = served("--function", "math_answer")
    assert httpx.get(f"{base}/health").json() == {"status": "ok", "reward": "math_answer"}
    answer = httpx.post(f"{base}/get_reward", json={"query": ["Q: 1+1=2", "Q: 1+1=3"], "prompts": ["Q:", "Q:"],
                                                    "labels": ["2", "2"]}).json()
    assert answer["rewards"] == [1.0, 0.0] and answer["scores"] == [1.0, 0.0]
    bad = httpx.post(f"{base}/get_reward", json={"query": ["a", "b"], "prompts": ["a"], "labels": ["1", "2"]})
    assert bad.status_code == 422


def test_serves_a_reward_model(served, tiny_reward_model_path) -> None:
    base = served("--model", str(tiny_reward_model_path))
    answer = httpx.post(f"{base}/get_reward", json={"query": ["hello world", "what is 1+1"]}).json()
    assert len(answer["rewards"]) == 2 and answer["rewards"] != [0.0, 0.0]


def test_binds_loopback_by_default() -> None:
    import argparse

    from rlhf_plugin_reward_server.command import ServeCommand

    parser = argparse.ArgumentParser()
    ServeCommand.add_arguments(parser)
    args = parser.parse_args(["reward", "--function", "x"])
    assert args.host == "127.0.0.1" and args.port == 5000
