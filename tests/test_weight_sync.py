"""Weight sync backends (runtime/weight_sync.py): bucketing, the gloo broadcast itself, and engines
that end up computing identical log-probs whichever backend synced them."""

from __future__ import annotations

import random
import threading

import pytest
import torch
from rlhf_test_support import base_flags

from rlhf.runtime.weight_sync import BroadcastGroup, buckets, module_layout, receive_weights, send_weights
from rlhf.runtime.worker_group import free_port


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


@pytest.mark.parametrize("backend", ["gloo", pytest.param("nccl", marks=[pytest.mark.gpu, _TWO_GPUS])])
def test_broadcast_delivers_every_parameter_exactly(backend) -> None:
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(300, 200), torch.nn.LayerNorm(200), torch.nn.Linear(200, 7))
    module[2].to(torch.bfloat16)  # a second dtype: its own bucket
    if backend == "nccl":
        module.to("cuda:0")
    layout = module_layout(module)
    port = free_port()
    received: dict[str, torch.Tensor] = {}

    def engine() -> None:
        if backend == "nccl":
            torch.cuda.set_device(1)
        group = BroadcastGroup("127.0.0.1", port, 1, 2, backend)
        received.update({name: tensor.cpu() for name, tensor in receive_weights(group, layout)})

    thread = threading.Thread(target=engine)
    thread.start()
    send_weights(module, BroadcastGroup("127.0.0.1", port, 0, 2, backend), layout)
    thread.join(timeout=60)
    expected = module.state_dict()
    assert received.keys() == expected.keys()
    for name, tensor in received.items():
        assert tensor.dtype == expected[name].dtype and torch.equal(tensor, expected[name].cpu())


@pytest.mark.slow
@pytest.mark.parametrize("engine,extra", [("vllm", []), ("hf", ["--actor.num_gpus_per_node", "2", "--ds.zero_stage", "3"])],
                         ids=["vllm", "hf-zero3-2-ranks"])
def test_engines_compute_the_same_logprobs_after_a_gloo_or_object_store_sync(engine, extra, ray_cluster, task_files,
                                                                             tiny_causal_lm_path, tmp_path) -> None:
    from rlhf.config.loading import ConfigParser
    from rlhf.config.ppo import PPOConfig
    from rlhf.plugins import PluginHost
    from rlhf.runtime.controller import PPOController
    from rlhf.runtime.ppo_trainer import PPOTrainer
    from rlhf.runtime.weight_sync import WeightSync

    host = PluginHost.load()
    config, _ = ConfigParser(PPOConfig, host, prog="t").parse(
        base_flags(tiny_causal_lm_path, task_files["prompts"], tmp_path, engine, steps=1)
        + ["--reward.remote_url", str(task_files["reward"]), "--algo.advantage.estimator", "group_norm",
           "--rollout.n_samples_per_prompt", "4", "--train.batch_size", "16", "--algo.kl.init_coef", "0",
           "--actor.lr_warmup_ratio", "0", "--vllm.sync_backend", "gloo", *extra])
    config = PPOTrainer.prepare_config(config, host)
    config.plugin_set = host.resolved()
    controller = PPOController(config, host, tmp_path / "out")
    controller._check_inputs()
    controller._setup()
    controller.train_step(controller.schedule.next_batch())  # generate, train, sync over gloo
    assert controller.weight_sync.backend == "gloo"
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
    config.vllm.sync_backend = "object_store"
    WeightSync(config, controller.actor, controller.engines).sync()
    after_object_store = controller.engines.sequence_logprobs(probe)
    for gloo_logprobs, store_logprobs in zip(after_gloo, after_object_store):
        assert torch.allclose(torch.tensor(gloo_logprobs), torch.tensor(store_logprobs), atol=1e-6, rtol=0)


@pytest.mark.parametrize("lora_rank,tp_size,cuda,expected", [
    (0, 1, False, "gloo"), (0, 1, True, "nccl"), (4, 1, False, "object_store"), (4, 1, True, "object_store"),
    (0, 2, False, "object_store"), (0, 2, True, "object_store")])
def test_auto_picks_a_broadcast_unless_lora_or_autotp_needs_the_full_state(lora_rank, tp_size, cuda, expected,
                                                                           monkeypatch) -> None:
    from rlhf.config.ppo import PPOConfig
    from rlhf.runtime.weight_sync import backend_for

    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)  # the choice itself, not a CUDA fault
    config = PPOConfig()
    config.ds.lora.rank, config.ds.tensor_parallel_size = lora_rank, tp_size
    assert config.vllm.sync_backend == "auto"
    assert backend_for(config) == expected
