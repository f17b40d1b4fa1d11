"""The official ``tinker`` SDK drives ``rlhf serve tinker`` on loopback, as its users drive the hosted service.

The server runs in this process (uvicorn on a thread) so that a test can read the trained adapter and compute
log-probs from it directly; one test starts the real command in a subprocess.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import tinker
from rlhf_plugin_ppo.loss import PPOClipLoss
from rlhf_plugin_tinker_server.app import build_app
from rlhf_plugin_tinker_server.models import load_served_model
from rlhf_plugin_tinker_server.service import TinkerService
from tinker import types

from rlhf.distributed import free_port

pytestmark = pytest.mark.usefixtures("one_torch_thread")

KEY = "tml-local-test"
TOKENS = [5, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51]


@dataclass
class Server:
    base_url: str
    service: TinkerService


@contextlib.contextmanager
def serving(model_path, checkpoint_root: Path) -> Iterator[Server]:
    """A server in this process on a free loopback port, with the model freshly loaded from disk."""
    import uvicorn

    service = TinkerService({"tiny": load_served_model("tiny", str(model_path), "fp32")}, PPOClipLoss, checkpoint_root)
    port = free_port()
    uvicorn_server = uvicorn.Server(uvicorn.Config(build_app(service, KEY), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=uvicorn_server.run, daemon=True)
    thread.start()
    deadline = time.time() + 30
    while not uvicorn_server.started:
        assert time.time() < deadline and thread.is_alive(), "the server did not start"
        time.sleep(0.05)
    try:
        yield Server(f"http://127.0.0.1:{port}", service)
    finally:
        uvicorn_server.should_exit = True
        thread.join(timeout=30)
        service.close()


@pytest.fixture(scope="module")
def checkpoint_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("tinker-checkpoints")


@pytest.fixture(scope="module")
def server(tiny_causal_lm_path, checkpoint_root):
    with serving(tiny_causal_lm_path, checkpoint_root) as running:
        yield running


@pytest.fixture
def client(server):
    with tinker.ServiceClient(base_url=server.base_url, api_key=KEY) as service_client:
        yield service_client


def datum(tokens: list[int], **inputs) -> types.Datum:
    """Next-token alignment, as Tinker's docs build a datum: the input is all but the last token."""
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs={"target_tokens": tokens[1:], **inputs}
    )


def direct_logprobs(server: Server, model_id: str, tokens: list[int]) -> np.ndarray:
    """The trained model's log-probs of ``tokens[1:]``, read from the server's module with plain torch."""
    import torch

    run = server.service.runs[model_id]
    with torch.no_grad(), run.served.using(run.adapter) as module:
        logits = module(input_ids=torch.tensor([tokens[:-1]])).logits[0].float()
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens[1:])[:, None])[:, 0].numpy()


def test_cross_entropy_falls_and_every_logprob_is_the_trained_models(server, client) -> None:
    training = client.create_lora_training_client(base_model="tiny", rank=4, seed=0).result()
    example = datum(TOKENS, weights=[1.0] * (len(TOKENS) - 1))
    losses = []
    for _ in range(4):
        result = training.forward_backward([example], "cross_entropy")
        training.optim_step(types.AdamParams(learning_rate=2e-3)).result()
        losses.append(result.result().metrics["loss:sum"])
    assert losses == sorted(losses, reverse=True) and losses[-1] < losses[0] - 0.5, losses

    forward = training.forward([example], "cross_entropy").result()
    expected = direct_logprobs(server, training.model_id, TOKENS)
    returned = forward.loss_fn_outputs[0]["logprobs"].to_numpy()
    np.testing.assert_allclose(returned, expected, atol=1e-5)
    assert forward.metrics["loss:sum"] == pytest.approx(-expected.sum(), abs=1e-4)

    sampler = training.save_weights_and_get_sampling_client().result()
    prompt = TOKENS[:4]
    answer = sampler.sample(types.ModelInput.from_ints(prompt), 2, types.SamplingParams(max_tokens=5, seed=3)).result()
    for sequence in answer.sequences:
        assert len(sequence.tokens) == len(sequence.logprobs) and sequence.stop_reason in ("stop", "length")
        full = prompt + list(sequence.tokens)
        np.testing.assert_allclose(
            sequence.logprobs, direct_logprobs(server, training.model_id, full)[len(prompt) - 1 :], atol=1e-4
        )
    scored = sampler.compute_logprobs(types.ModelInput.from_ints(TOKENS)).result()
    assert scored[0] is None
    np.testing.assert_allclose(scored[1:], expected, atol=1e-4)


def test_each_loss_is_its_formula_on_random_inputs(client) -> None:
    training = client.create_lora_training_client(base_model="tiny", rank=4, seed=1).result()
    rng = np.random.default_rng(0)
    count = len(TOKENS) - 1
    weights = rng.uniform(0, 1, count).astype(np.float32)
    plain = training.forward([datum(TOKENS, weights=weights)], "cross_entropy").result()
    logprobs = plain.loss_fn_outputs[0]["logprobs"].to_numpy().astype(np.float64)
    assert plain.metrics["loss:sum"] == pytest.approx(-(weights * logprobs).sum(), rel=1e-5)

    sampler_logprobs = (logprobs + rng.normal(0, 0.3, count)).astype(np.float32)
    advantages = rng.normal(0, 1, count).astype(np.float32)
    ratio = np.exp(logprobs - sampler_logprobs)
    rl_inputs = {"logprobs": sampler_logprobs, "advantages": advantages}
    sampled = training.forward([datum(TOKENS, **rl_inputs)], "importance_sampling").result()
    assert sampled.metrics["loss:sum"] == pytest.approx(-(ratio * advantages).sum(), rel=1e-4)

    low, high = 0.9, 1.1
    clipped = training.forward(
        [datum(TOKENS, **rl_inputs)], "ppo", {"clip_low_threshold": low, "clip_high_threshold": high}
    ).result()
    objective = np.minimum(ratio * advantages, np.clip(ratio, low, high) * advantages)
    assert (np.clip(ratio, low, high) != ratio).any()  # the random inputs reach the clip
    assert clipped.metrics["loss:sum"] == pytest.approx(-objective.sum(), rel=1e-4)

    cispo = training.forward([datum(TOKENS, **rl_inputs)], "cispo", {"clip_high_threshold": high}).result()
    assert cispo.metrics["loss:sum"] == pytest.approx(-(np.clip(ratio, 0.0, high) * logprobs * advantages).sum(), rel=1e-4)
    dro = training.forward([datum(TOKENS, **rl_inputs)], "dro", {"beta": 0.5}).result()
    penalty = 0.25 * (logprobs - sampler_logprobs) ** 2
    assert dro.metrics["loss:sum"] == pytest.approx(-(logprobs * advantages - penalty).sum(), rel=1e-4)


def test_a_custom_loss_runs_client_side_through_cross_entropy(client) -> None:
    """forward_backward_custom: the SDK takes the log-probs from forward, differentiates the user's loss itself and
    sends its gradient back as cross_entropy weights, so this server needs nothing more for it."""
    import torch

    training = client.create_lora_training_client(base_model="tiny", rank=4, seed=2).result()
    example = datum(TOKENS, weights=[1.0] * (len(TOKENS) - 1))

    def negative_log_likelihood(data, logprobs_list):
        loss = sum(
            -(logprobs * torch.tensor(d.loss_fn_inputs["weights"].data)).sum() for d, logprobs in zip(data, logprobs_list)
        )
        return loss, {"nll": float(loss.detach())}

    custom = training.forward_backward_custom([example], negative_log_likelihood).result()
    built_in = training.forward([example], "cross_entropy").result()
    assert custom.metrics["nll"] == pytest.approx(built_in.metrics["loss:sum"], rel=1e-6)


def _train_steps(training, steps: int, data: list[int] = TOKENS) -> list:
    """Each step's loss and log-probs."""
    seen = []
    for _ in range(steps):
        result = training.forward_backward([datum(data)], "cross_entropy")
        training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        result = result.result()
        seen.append((result.metrics["loss:sum"], result.loss_fn_outputs[0]["logprobs"].to_numpy().tolist()))
    return seen


def _train(training, data: list[int], steps: int) -> list:
    """Each step's loss and log-probs, and a seeded sample at the end: everything a tenant sees."""
    seen = _train_steps(training, steps, data)
    sampler = training.save_weights_and_get_sampling_client().result()
    answer = sampler.sample(types.ModelInput.from_ints(data[:3]), 2, types.SamplingParams(max_tokens=4, seed=7)).result()
    return seen + [[(list(s.tokens), list(s.logprobs)) for s in answer.sequences]]


def test_a_tenant_beside_another_is_bit_identical_to_it_alone(client) -> None:
    alone = _train(client.create_lora_training_client(base_model="tiny", rank=4, seed=11).result(), TOKENS, 3)

    tenant = client.create_lora_training_client(base_model="tiny", rank=4, seed=11).result()
    other = client.create_lora_training_client(base_model="tiny", rank=8, seed=12).result()
    other_data = [7, 9, 11, 13, 15, 17, 19]
    other.forward_backward([datum(other_data)], "cross_entropy")  # queued before and between the tenant's requests
    beside = []
    for _ in range(3):
        result = tenant.forward_backward([datum(TOKENS)], "cross_entropy")
        other.optim_step(types.AdamParams(learning_rate=5e-2))
        tenant.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        other.forward_backward([datum(other_data)], "cross_entropy")
        result = result.result()
        beside.append((result.metrics["loss:sum"], result.loss_fn_outputs[0]["logprobs"].to_numpy().tolist()))
    sampler = tenant.save_weights_and_get_sampling_client().result()
    answer = sampler.sample(types.ModelInput.from_ints(TOKENS[:3]), 2, types.SamplingParams(max_tokens=4, seed=7)).result()
    beside.append([(list(s.tokens), list(s.logprobs)) for s in answer.sequences])
    assert beside == alone  # exact equality: bit for bit


def test_a_restarted_server_resumes_a_run_from_its_last_save_state(
    server, client, tiny_causal_lm_path, checkpoint_root
) -> None:
    training = client.create_lora_training_client(base_model="tiny", rank=4, seed=5).result()
    steps = _train_steps(training, 2)
    path = training.save_state("step-2").result().path
    assert path == f"tinker://{training.model_id}/weights/step-2"
    after_save = _train_steps(training, 2)

    with serving(tiny_causal_lm_path, checkpoint_root) as restarted:
        with tinker.ServiceClient(base_url=restarted.base_url, api_key=KEY) as again:
            resumed = again.create_training_client_from_state_with_optimizer(path).result()
            assert _train_steps(resumed, 2) == after_save  # weights and Adam moments: the same steps, bit for bit
            fresh_optimizer = again.create_training_client_from_state(path).result()
            assert fresh_optimizer.forward([datum(TOKENS)], "cross_entropy").result().metrics["loss:sum"] == after_save[0][0]
    assert steps[0][0] > after_save[-1][0]
    with pytest.raises(tinker.RequestFailedError, match="already has a checkpoint of that name"):
        training.save_state("step-2").result()
    with pytest.raises(tinker.RequestFailedError, match="no checkpoint there on this server"):
        client.create_training_client_from_state(f"tinker://{training.model_id}/weights/step-9").result()


def test_a_run_keeps_its_latest_sampler_snapshots_loaded_and_refuses_older_ones_by_name(server, client) -> None:
    training = client.create_lora_training_client(base_model="tiny", rank=2, seed=0).result()
    keep = server.service.keep_snapshots
    samplers = [training.save_weights_and_get_sampling_client().result() for _ in range(keep + 1)]
    prompt, params = types.ModelInput.from_ints(TOKENS[:3]), types.SamplingParams(max_tokens=2, seed=0)
    with pytest.raises(tinker.NotFoundError, match=f"newer ones replaced; this server keeps each run's last {keep}"):
        samplers[0].sample(prompt, 1, params).result()
    assert len(samplers[-1].sample(prompt, 1, params).result().sequences) == 1
    snapshots = [
        name
        for name in server.service.models["tiny"].adapters
        if name.startswith(f"{server.service.runs[training.model_id].adapter}_")
    ]
    assert len(snapshots) == keep


def test_a_closed_session_frees_its_runs_and_leaves_the_others_training(server, client) -> None:
    staying = client.create_lora_training_client(base_model="tiny", rank=2, seed=3).result()
    adapters = server.service.models["tiny"].adapters
    with tinker.ServiceClient(base_url=server.base_url, api_key=KEY) as leaving:
        gone = leaving.create_lora_training_client(base_model="tiny", rank=2, seed=4).result()
        gone.save_weights_and_get_sampling_client().result()
        held = len(adapters)
    deadline = time.time() + 30
    while gone.model_id in server.service.runs:
        assert time.time() < deadline, "the closed session's run was not freed"
        time.sleep(0.05)
    assert len(adapters) == held - 2  # its adapter and its sampler snapshot
    with pytest.raises(ValueError, match="the training run of session .*, which ended"):
        server.service.run(gone.model_id)
    assert math.isfinite(staying.forward([datum(TOKENS)], "cross_entropy").result().metrics["loss:sum"])


def test_concurrent_clients_each_get_the_numbers_of_their_solo_run(server) -> None:
    """Bounded concurrent clients on loopback, each with its own ServiceClient on its own thread: no request is lost
    and every tenant's losses and log-probs are its solo run's, bit for bit; the step latencies are reported."""
    from concurrent.futures import ThreadPoolExecutor

    def tenant(seed: int) -> tuple[list, list[float]]:
        with tinker.ServiceClient(base_url=server.base_url, api_key=KEY) as own:
            training = own.create_lora_training_client(base_model="tiny", rank=2, seed=seed).result()
            latencies, seen = [], []
            for _ in range(3):
                started = time.perf_counter()
                seen += _train_steps(training, 1, TOKENS[: 6 + seed % 5])
                latencies.append(time.perf_counter() - started)
            return seen, latencies

    seeds = [31, 32, 33, 34, 31, 32, 33, 34]
    solo = {seed: tenant(seed)[0] for seed in set(seeds)}
    with ThreadPoolExecutor(max_workers=4) as pool:
        together = list(pool.map(tenant, seeds))
    assert [seen for seen, _ in together] == [solo[seed] for seed in seeds]
    latencies = sorted(latency for _, steps in together for latency in steps)
    p50, p95 = latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.95)]
    print(
        f"step latency with 4 concurrent clients: p50 {p50 * 1e3:.0f} ms, p95 {p95 * 1e3:.0f} ms, max {latencies[-1] * 1e3:.0f} ms"
    )
    assert latencies[-1] < 60


def test_the_async_client_trains_and_samples(server) -> None:
    async def run() -> tuple[float, int]:
        with tinker.ServiceClient(base_url=server.base_url, api_key=KEY) as service_client:
            training = await service_client.create_lora_training_client(base_model="tiny", rank=2, seed=0)
            result = await training.forward_backward([datum(TOKENS)], "cross_entropy")
            await training.optim_step(types.AdamParams(learning_rate=1e-3))
            sampler = await training.save_weights_and_get_sampling_client()
            answer = await sampler.sample(types.ModelInput.from_ints(TOKENS[:3]), 1, types.SamplingParams(max_tokens=3))
            return result.metrics["loss:sum"], len(answer.sequences[0].tokens)

    loss, sampled = asyncio.run(run())
    assert math.isfinite(loss) and loss > 0 and sampled == 3


def test_bad_requests_are_the_sdks_errors_naming_what_is_wrong(server, client) -> None:
    training = client.create_lora_training_client(base_model="tiny", rank=2, seed=0).result()
    with pytest.raises(tinker.RequestFailedError, match="loss_fn 'stable_reinforce' is not supported"):
        training.forward_backward([datum(TOKENS)], "stable_reinforce").result()
    with pytest.raises(tinker.RequestFailedError, match="needs 'advantages'"):
        training.forward_backward([datum(TOKENS, logprobs=[0.0] * (len(TOKENS) - 1))], "ppo").result()
    with pytest.raises(tinker.RequestFailedError, match=r"loss_fn_inputs\['weights'\]: 3 values for 12 input tokens"):
        training.forward_backward([datum(TOKENS, weights=[1.0, 1.0, 1.0])], "cross_entropy").result()
    too_long = list(range(5, 5 + server.service.models["tiny"].max_context_length + 2))
    with pytest.raises(tinker.RequestFailedError, match=r"data\[0\].model_input: \d+ tokens pass the tiny context"):
        training.forward_backward([datum(too_long)], "cross_entropy").result()
    with pytest.raises(tinker.RequestFailedError, match=r"target_tokens'\]: token id 99999 is outside the tiny vocabulary"):
        training.forward_backward([datum([*TOKENS, 99999])], "cross_entropy").result()
    # the run is untouched by its refused requests
    assert math.isfinite(training.forward_backward([datum(TOKENS)], "cross_entropy").result().metrics["loss:sum"])
    base = client.create_sampling_client(base_model="tiny").result()
    prompt, params = types.ModelInput.from_ints(TOKENS[:3]), types.SamplingParams(max_tokens=2)
    with pytest.raises(tinker.UnprocessableEntityError, match="topk_sample_logprobs: this server does not compute it"):
        base.sample(prompt, 1, params, topk_sample_logprobs=2).result()
    assert len(base.sample(prompt, 1, params).result().sequences[0].tokens) == 2
    with pytest.raises(tinker.NotFoundError, match="base_model 'Qwen/Qwen3-8B': this server serves tiny"):
        client.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=2).result()


def test_the_server_answers_only_holders_of_its_key(server) -> None:
    assert httpx.get(f"{server.base_url}/api/v1/healthz").json() == {"status": "ok"}  # health needs no key
    capabilities = tinker.RestClient(base_url=server.base_url, api_key=KEY).get_server_capabilities().result()
    assert [(m.model_name, m.trainable, m.sampleable) for m in capabilities.supported_models] == [("tiny", True, True)]
    with pytest.raises(tinker.AuthenticationError, match="needs its API key"):
        tinker.ServiceClient(base_url=server.base_url, api_key="tml-wrong").create_lora_training_client(
            base_model="tiny", rank=2
        )


@pytest.mark.slow
def test_the_command_serves_its_models_by_the_names_it_was_given(tiny_causal_lm_path, request) -> None:
    port = free_port()
    env = {**os.environ, "TINKER_API_KEY": "tml-from-the-environment"}  # the flag wins over the variable
    command = [sys.executable, "-m", "rlhf", "serve", "tinker", "--model", f"tiny={tiny_causal_lm_path}", "--port", str(port)]
    process = subprocess.Popen([*command, "--api-key", KEY], env=env, stderr=subprocess.PIPE, text=True)
    request.addfinalizer(lambda: (process.terminate(), process.wait(timeout=30)))
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while True:
        try:
            if httpx.get(f"{base}/api/v1/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            assert process.poll() is None and time.time() < deadline, process.stderr.read()
            time.sleep(0.2)
    with tinker.ServiceClient(base_url=base, api_key=KEY) as service_client:
        training = service_client.create_lora_training_client(base_model="tiny", rank=2).result()
        assert math.isfinite(training.forward([datum(TOKENS)], "cross_entropy").result().metrics["loss:sum"])
