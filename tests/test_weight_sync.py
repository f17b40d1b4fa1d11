"""Weight-sync transports (runtime/sync/weights.py picks them; rlhf-plugin-torch-sync and rlhf-plugin-vllm
implement them): bucketing, the gloo broadcast itself, and engines that end up computing identical
log-probs whichever transport synced them."""

from __future__ import annotations

import contextlib
import importlib.util
import random
import threading
import types
from typing import Any

import pytest
import torch
from rlhf_plugin_torch_sync.broadcast import BroadcastGroup, receive_weights, send_weights
from rlhf_test_support import base_flags

from rlhf.distributed import free_port
from rlhf.runtime.sync.weights import gathered_buckets, module_layout
from rlhf.weight_buckets import buckets


def test_buckets_keep_order_one_dtype_each_and_the_size_limit() -> None:
    rng = random.Random(0)
    layout = [(f"w{i}", (rng.randint(1, 40), rng.randint(1, 40)), rng.choice(["float32", "bfloat16"])) for i in range(200)]
    limit = 4000
    split = buckets(layout, limit)
    assert [entry for bucket in split for entry in bucket] == layout
    for bucket in split:
        assert len({dtype for _, _, dtype in bucket}) == 1
        size = sum(a * b * getattr(torch, bucket[0][2]).itemsize for _, (a, b), _ in bucket)
        assert size <= limit or len(bucket) == 1


_TWO_GPUS = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="NCCL needs a distinct GPU per rank")


@pytest.mark.parametrize("backend", ["gloo", pytest.param("nccl", marks=[pytest.mark.gpu, pytest.mark.timeout(120), _TWO_GPUS])])
def test_broadcast_delivers_every_parameter_exactly(backend) -> None:
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(300, 200), torch.nn.LayerNorm(200), torch.nn.Linear(200, 7))
    module[2].to(torch.bfloat16)  # a second dtype: its own bucket
    if backend == "nccl":
        module.to("cuda:0")
    live = module.state_dict(keep_vars=True)
    unsharded = types.SimpleNamespace(module=module, full_shape=lambda t: tuple(t.shape),  # one whole-weights rank
                                      full_tensors=lambda names: contextlib.nullcontext([live[n] for n in names]))
    layout = module_layout(unsharded)
    port = free_port()
    received: dict[str, torch.Tensor] = {}

    def engine() -> None:
        if backend == "nccl":
            torch.cuda.set_device(1)
        group = BroadcastGroup("127.0.0.1", port, 1, 2, backend)
        received.update({name: tensor.cpu() for name, tensor in receive_weights(group, layout)})

    thread = threading.Thread(target=engine)
    thread.start()
    source = types.SimpleNamespace(gathered_buckets=lambda layout: gathered_buckets(unsharded, layout))
    send_weights(source, BroadcastGroup("127.0.0.1", port, 0, 2, backend), layout)
    thread.join(timeout=60)
    expected = module.state_dict()
    assert received.keys() == expected.keys()
    for name, tensor in received.items():
        assert tensor.dtype == expected[name].dtype and torch.equal(tensor, expected[name].cpu())


def _controller_after_one_step(engine: str, backend: str, extra: list[str], task_files, model_path, tmp_path) -> Any:
    """A PPO controller that has generated, trained one step and synced its engines by ``backend``."""
    from rlhf.config.loading import ConfigParser
    from rlhf.config.ppo import PPOConfig
    from rlhf.host.plugin_host import PluginHost
    from rlhf.runtime.control.controller import PPOController
    from rlhf.runtime.control.trainer import PPOTrainer

    host = PluginHost.load()
    config, _ = ConfigParser(PPOConfig, host, prog="t").parse(
        base_flags(model_path, task_files["prompts"], tmp_path, engine, steps=1)
        + ["--reward.remote_url", str(task_files["reward"]), "--algo.advantage.estimator", "group_norm",
           "--rollout.n_samples_per_prompt", "4", "--train.batch_size", "16", "--algo.kl.init_coef", "0",
           "--actor.lr_warmup_ratio", "0", "--vllm.sync_backend", backend, *extra])
    config = PPOTrainer.prepare_config(config, host)
    config.plugin_set = host.resolved()
    controller = PPOController(config, host, tmp_path / "out")
    controller._check_inputs()
    controller._setup()
    controller.train_step(controller.schedule.next_batch())  # generate, train, sync by the backend
    assert controller.weight_sync.backend == backend
    return controller


def _logprobs_after_an_object_store_sync(controller: Any, probe: list[int]) -> list[list[float]]:
    from rlhf.runtime.sync.weights import WeightSync

    controller.config.vllm.sync_backend = "object_store"
    WeightSync(controller.config, controller.actor, controller.engines).sync()
    return controller.engines.sequence_logprobs(probe)


@pytest.mark.slow
@pytest.mark.parametrize("engine,extra", [
    ("vllm", ["--train.in_process", "on"]),  # the one rank in this process, beside the engine's: the CPU layout
    # two ranks in Ray workers and an HF engine process of its own (auto would generate in the ranks: nothing to sync)
    ("hf", ["--actor.num_gpus_per_node", "2", "--ds.zero_stage", "3", "--rollout.engine", "hf"]),
], ids=["vllm", "hf-zero3-2-ranks"])
def test_engines_compute_the_same_logprobs_after_a_gloo_or_object_store_sync(engine, extra, ray_cluster, task_files,
                                                                             tiny_causal_lm_path, tmp_path) -> None:
    """An engine synced by a gloo broadcast holds the actor's weights exactly and computes the log-probs an fp32 HF
    forward of them gives, and those an object-store sync gives: a vLLM engine from a rank in the controller's
    process (ZeRO-2), an HF engine process from two ZeRO-3 ranks in Ray workers."""
    from rlhf.runtime.cluster.local import in_process_ranks

    with in_process_ranks():  # as a run restores its process after ranks lived in it
        _assert_gloo_sync_matches(engine, extra, task_files, tiny_causal_lm_path, tmp_path)


def _assert_gloo_sync_matches(engine: str, extra: list[str], task_files, tiny_causal_lm_path, tmp_path) -> None:
    controller = _controller_after_one_step(engine, "gloo", extra, task_files, tiny_causal_lm_path, tmp_path)
    assert controller.in_process == (engine == "vllm")
    probe = controller.tokenizer("what is 12+34? 46 and more text")["input_ids"]
    after_gloo = controller.engines.sequence_logprobs(probe)
    actor_state = controller.actor.call("full_state")[0]
    difference, compared = controller.engines.max_weight_difference(actor_state)
    assert difference == 0.0 and compared >= 6

    from transformers import AutoModelForCausalLM

    actor_model = AutoModelForCausalLM.from_pretrained(tiny_causal_lm_path)
    actor_model.load_state_dict(actor_state)
    with torch.no_grad():
        logits = actor_model(torch.tensor([probe])).logits[0, :-1]
    expected = torch.log_softmax(logits, -1).gather(-1, torch.tensor(probe[1:])[:, None])[:, 0]
    for engine_logprobs in after_gloo:  # every weight, repacked by vLLM's CPU backend or not
        assert torch.allclose(torch.tensor(engine_logprobs), expected, atol=1e-5, rtol=0)
    if engine == "vllm":
        _assert_vllm_samples_with_the_logprobs_of_hf(controller, actor_model)
    after_object_store = _logprobs_after_an_object_store_sync(controller, probe)
    for gloo_logprobs, store_logprobs in zip(after_gloo, after_object_store):
        assert torch.allclose(torch.tensor(gloo_logprobs), torch.tensor(store_logprobs), atol=1e-6, rtol=0)


def _assert_vllm_samples_with_the_logprobs_of_hf(controller: Any, hf_model: Any) -> None:
    """The tiny fixture model (tests/test_testing_kit.py's kit) generates in vLLM: 12 sampled tokens after a chat
    prompt, each with vLLM's own log-prob (not a prompt log-prob), within 1e-4 of an fp32 HF forward of the same
    weights."""
    prompt = controller.tokenizer.apply_chat_template([{"role": "user", "content": "12+34="}],
                                                      add_generation_prompt=True)["input_ids"]
    (sampled,) = controller.engines.generate([{"prompt_ids": prompt, "max_tokens": 12, "seed": 0}], 1.0, 1.0)
    tokens = sampled["response_ids"]
    assert len(tokens) == 12 and len(sampled["logprobs"]) == 12, sampled
    with torch.no_grad():
        logits = hf_model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1]
    hf_logprobs = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]
    assert (torch.tensor(sampled["logprobs"]) - hf_logprobs).abs().max() < 1e-4


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.timeout(160)  # Ray, one training step and two syncs of a tiny model, vLLM's start-up the most of it
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA IPC needs a CUDA GPU")
@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (a GPU image may come without it)")
@pytest.mark.parametrize("extra", [[], ["--ds.zero_stage", "3"]], ids=["zero2", "zero3"])
def test_engines_compute_the_same_logprobs_after_an_ipc_or_object_store_sync(extra, ray_cluster, task_files,
                                                                            tiny_causal_lm_path, tmp_path) -> None:
    """One vLLM engine colocated with the actor on one GPU: after a step synced by CUDA IPC, the
    engine holds the actor's weights exactly and computes the log-probs an object-store sync gives."""
    flags = ["--train.colocate_all", "--ds.param_dtype", "bf16", *extra]
    controller = _controller_after_one_step("vllm", "ipc", flags, task_files, tiny_causal_lm_path, tmp_path)
    probe = controller.tokenizer("what is 12+34? 46 and more text")["input_ids"]
    after_ipc = controller.engines.sequence_logprobs(probe)
    difference, compared = controller.engines.max_weight_difference(controller.actor.call("full_state")[0])
    assert difference == 0.0 and compared >= 6
    after_object_store = _logprobs_after_an_object_store_sync(controller, probe)
    for ipc_logprobs, store_logprobs in zip(after_ipc, after_object_store):
        assert torch.allclose(torch.tensor(ipc_logprobs), torch.tensor(store_logprobs), atol=1e-6, rtol=0)


@pytest.mark.parametrize("lora_rank,tp_size,cuda,expected", [
    (0, 1, False, "gloo"), (0, 1, True, "nccl"), (4, 1, False, "object_store"), (4, 1, True, "object_store"),
    (0, 2, False, "object_store"), (0, 2, True, "object_store")])
def test_auto_picks_a_broadcast_unless_lora_or_autotp_needs_the_full_state(lora_rank, tp_size, cuda, expected,
                                                                           monkeypatch) -> None:
    from rlhf.config.ppo import PPOConfig
    from rlhf.runtime.sync.weights import backend_for

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)  # the choice itself, not a CUDA fault
    config = PPOConfig()
    config.ds.lora.rank, config.ds.tensor_parallel_size = lora_rank, tp_size
    assert config.vllm.sync_backend == "auto"
    assert backend_for(config) == expected


@pytest.mark.parametrize("colocate_all,num_engines,async_enable,cuda,expected", [
    (True, 1, False, True, "ipc"),           # vLLM engines on the actor's GPUs: OpenRLHF's hybrid engine
    (True, 1, False, False, "gloo"),         # no CUDA, no IPC
    (False, 1, False, True, "nccl"),         # engines on GPUs of their own
    (True, 0, False, True, "gloo"),          # HF generate: no vLLM worker to open the handles; NCCL refuses one GPU twice
    (True, 1, True, True, "gloo")])          # async: the engines generate while the actor trains
def test_auto_picks_ipc_when_vllm_engines_share_the_actors_gpus(colocate_all, num_engines, async_enable, cuda,
                                                                 expected) -> None:
    from rlhf.config.ppo import PPOConfig
    from rlhf.runtime.sync.weights import backend_for

    config = PPOConfig()
    config.train.colocate_all, config.vllm.num_engines, config.train.async_enable = colocate_all, num_engines, async_enable
    assert backend_for(config, cuda=cuda) == expected


@pytest.mark.parametrize("change,cuda,reason", [
    ({}, False, "no CUDA GPU where the run's ranks and engines run"),
    ({"colocate_all": False}, True, "--train.colocate_all"),
    ({"num_engines": 0}, True, "--vllm.num_engines 0"),
    ({"async_enable": True}, True, "--train.async_enable"),
    ({"lora_rank": 4}, True, "--ds.lora.rank")])
def test_ipc_where_it_cannot_run_is_a_config_error_naming_why(change, cuda, reason) -> None:
    from rlhf.config.ppo import PPOConfig
    from rlhf.errors import ConfigError
    from rlhf.runtime.sync.weights import backend_for

    config = PPOConfig()
    config.vllm.sync_backend = "ipc"
    config.train.colocate_all = change.get("colocate_all", True)
    config.vllm.num_engines = change.get("num_engines", 1)
    config.train.async_enable = change.get("async_enable", False)
    config.ds.lora.rank = change.get("lora_rank", 0)
    with pytest.raises(ConfigError) as error:
        backend_for(config, cuda=cuda)
    assert "--vllm.sync_backend ipc cannot run" in str(error.value) and reason in str(error.value)
    assert "--vllm.sync_backend object_store" in str(error.value)
    config.ds.lora.rank, config.train.async_enable, config.train.colocate_all, config.vllm.num_engines = 0, False, True, 1
    assert backend_for(config, cuda=True) == "ipc"  # the same run with that one thing put right
