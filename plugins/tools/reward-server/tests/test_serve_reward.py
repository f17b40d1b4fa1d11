"""`rlhf serve reward`: a real server process answering OpenRLHF's protocol on loopback."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest

from rlhf.distributed import free_port

#: httpx's default is 5 s: a reward computed on a loaded 2-core CI machine took longer (a ReadTimeout at load 29)
HTTP = httpx.Client(timeout=60)


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
    assert HTTP.get(f"{base}/health").json() == {"status": "ok", "reward": "math_answer"}
    answer = HTTP.post(f"{base}/get_reward", json={"query": ["Q: 1+1=2", "Q: 1+1=3"], "prompts": ["Q:", "Q:"],
                                                    "labels": ["2", "2"]}).json()
    assert answer["rewards"] == [1.0, 0.0] and answer["scores"] == [1.0, 0.0]
    bad = HTTP.post(f"{base}/get_reward", json={"query": ["a", "b"], "prompts": ["a"], "labels": ["1", "2"]})
    assert bad.status_code == 422


@pytest.mark.slow
def test_serves_a_reward_model(served, tiny_reward_model_path) -> None:
    base = served("--model", str(tiny_reward_model_path))
    answer = HTTP.post(f"{base}/get_reward", json={"query": ["hello world", "what is 1+1"]}).json()
    assert len(answer["rewards"]) == 2 and answer["rewards"] != [0.0, 0.0]


def test_binds_loopback_by_default() -> None:
    import argparse

    from rlhf_plugin_reward_server.command import ServeCommand

    parser = argparse.ArgumentParser()
    ServeCommand.add_arguments(parser)
    args = parser.parse_args(["--function", "x"])
    assert args.host == "127.0.0.1" and args.port == 5000


def test_a_server_with_an_api_key_answers_only_requests_that_carry_it(served, monkeypatch) -> None:
    monkeypatch.setenv("RLHF_REWARD_API_KEY", "s3cret")  # the server's process inherits it: no key on its command line
    base = served("--function", "math_answer")
    body = {"query": ["Q: 1+1=2"], "prompts": ["Q:"], "labels": ["2"]}
    refused = HTTP.post(f"{base}/get_reward", json=body)
    assert refused.status_code == 401 and "API key" in refused.json()["error"]
    assert HTTP.post(f"{base}/get_reward", json=body, headers={"Authorization": "Bearer wrong"}).status_code == 401
    for header in ({"Authorization": "Bearer s3cret"}, {"X-Api-Key": "s3cret"}):
        assert HTTP.post(f"{base}/get_reward", json=body, headers=header).json()["rewards"] == [1.0]
    assert HTTP.get(f"{base}/health").status_code == 200  # health checks need no key


def test_a_reward_model_scores_in_batches_cut_to_max_len_and_normalised(tiny_reward_model_path, tmp_path) -> None:
    import random

    import torch
    from rlhf_plugin_reward_server.server import model_reward
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from rlhf.errors import ConfigError

    rng = random.Random(0)
    queries = [" ".join(rng.choice(["one", "two", "plus", "equals", "what"]) for _ in range(rng.randint(2, 12)))
               for _ in range(5)]
    tokenizer = AutoTokenizer.from_pretrained(tiny_reward_model_path)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_reward_model_path, num_labels=1).eval()

    def direct(texts, max_len=None):
        with torch.no_grad():
            return [model(**tokenizer([t], truncation=max_len is not None, max_length=max_len,
                                      return_tensors="pt")).logits[0, 0].item() for t in texts]

    whole = model_reward(str(tiny_reward_model_path))(queries, [""] * 5, [""] * 5)
    assert whole == pytest.approx(direct(queries), abs=1e-4)
    assert model_reward(str(tiny_reward_model_path), batch_size=2)(queries, [""] * 5, [""] * 5) == pytest.approx(whole, abs=1e-4)
    cut = model_reward(str(tiny_reward_model_path), max_len=3)(queries, [""] * 5, [""] * 5)
    assert cut == pytest.approx(direct(queries, max_len=3), abs=1e-4)
    with pytest.raises(ConfigError, match="--normalize needs the reward statistics"):
        model_reward(str(tiny_reward_model_path), normalize=True)
    model.config.mean, model.config.std = 0.25, 2.0
    model.save_pretrained(tmp_path / "rm")
    tokenizer.save_pretrained(tmp_path / "rm")
    normalized = model_reward(str(tmp_path / "rm"), normalize=True)(queries, [""] * 5, [""] * 5)
    assert normalized == pytest.approx([(v - 0.25) / 2.0 for v in whole], abs=1e-4)
