"""Routing replay on tiny random MoE models: the HF engine records, the trainer's forward routes by the records."""

from __future__ import annotations

from pathlib import Path

import pytest
from rlhf_plugin_hf_generate.engine import HFEngine
from rlhf_plugin_moe_replay.extension import RECORD, RoutingReplay
from rlhf_plugin_moe_replay.routers import find_routers, taps_of

from rlhf.config.ppo import PPOConfig
from rlhf.models.extensions import ForwardTokens, before_forward, extension_metrics
from rlhf.testing.tiny import build_moe_causal_lm, build_tokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tokenizer(tmp_path_factory.mktemp("tok"))


def _model(tmp_path_factory: pytest.TempPathFactory, tokenizer_path: Path, family: str) -> Path:
    return build_moe_causal_lm(tmp_path_factory.mktemp(family), tokenizer_path, family=family, layers=2, experts=8, top_k=2)


def _config(mode: str) -> dict:
    config = PPOConfig()
    config.actor.routing_replay = mode
    config.rollout.micro_batch_size = 4
    return config.model_dump(mode="json")


def _generate(path: Path, mode: str, dtype: str = "bf16") -> list[dict]:
    engine = HFEngine(str(path), dtype, 512, 0, _config(mode))
    prompts = [[5, 9, 30, 41], [7, 8], [60, 61, 62, 63, 64, 65], [11, 12, 13]]
    requests = [{"prompt_ids": p, "max_tokens": 12, "seed": 3} for p in prompts]
    return [{**r, **request} for r, request in zip(engine.generate(requests, 1.0, 1.0), requests)]


def _trainer_forward(path: Path, mode: str, samples: list[dict], training: bool = True):
    """The trainer's fp32 forward of the samples, right-padded as the model workers build it, after the extension's
    ``before_forward``; the log-probs of each response token, and the extension."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    replay = RoutingReplay(mode)
    replay.wrap(model, "actor", PPOConfig())
    rows = [s["prompt_ids"] + s["response_ids"] for s in samples]
    width = max(map(len, rows))
    input_ids = torch.zeros((len(rows), width), dtype=torch.long)
    attention = torch.zeros_like(input_ids)
    for i, row in enumerate(rows):
        input_ids[i, : len(row)], attention[i, : len(row)] = torch.tensor(row), 1
    before_forward([replay], model, ForwardTokens((len(rows), width), list(range(len(rows))), [0] * len(rows),
                                                  list(map(len, rows)), [s.get("token_records") for s in samples], training))
    logits = model(input_ids=input_ids, attention_mask=attention).logits.float()
    logprobs = []
    for i, s in enumerate(samples):
        start = len(s["prompt_ids"])
        own = torch.log_softmax(logits[i, start - 1 : start - 1 + len(s["response_ids"])], dim=-1)
        logprobs.append(own.gather(-1, torch.tensor(s["response_ids"])[:, None])[:, 0])
    return logprobs, replay, model


@pytest.mark.parametrize("family", ["qwen3_moe", "olmoe"])
def test_the_trainer_routes_every_token_and_layer_as_the_engine_did(tmp_path_factory, tokenizer_path, family: str) -> None:
    path = _model(tmp_path_factory, tokenizer_path, family)
    samples = _generate(path, "rollout")
    for s in samples:  # every position the engine forwarded: the prompt and the response but its last token
        assert s["token_records"][RECORD].shape == (len(s["prompt_ids"]) + len(s["response_ids"]) - 1, 2, 2)
    _, replay, _ = _trainer_forward(path, "rollout", samples)
    metrics = extension_metrics([replay])
    assert metrics["moe/routing_mismatch"] == 0.0
    assert replay.taps["actor"].compared == 0  # read and reset
    # without replay the bf16 engine and the fp32 trainer disagree on some of the same (token, layer) pairs
    _, compared, _ = _trainer_forward(path, "record", samples)
    measured = extension_metrics([compared])
    assert measured["moe/routing_mismatch"] == measured["moe/router_disagreement"]
    assert metrics["moe/router_disagreement"] == measured["moe/router_disagreement"]


def test_replay_brings_the_trainer_log_probs_to_the_engine_s(tmp_path_factory, tokenizer_path) -> None:
    import torch

    path = _model(tmp_path_factory, tokenizer_path, "qwen3_moe")
    samples = _generate(path, "rollout")
    gaps = {}
    for mode in ("record", "rollout"):
        logprobs, _, _ = _trainer_forward(path, mode, samples, training=False)
        gaps[mode] = float(torch.cat([(lp.detach() - torch.tensor(s["logprobs"])).abs() for lp, s in zip(logprobs, samples)]).mean())
    assert gaps["rollout"] < gaps["record"], gaps


def test_replayed_weights_are_the_trainer_s_softmax_at_the_recorded_experts_and_train_the_router(tmp_path_factory, tokenizer_path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    path = _model(tmp_path_factory, tokenizer_path, "mixtral")

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    router = find_routers(model)[0]
    taps = taps_of(model)
    hidden = torch.randn(5, router.weight.shape[1])
    forced = torch.stack([torch.randperm(8)[:2] for _ in range(5)])
    forced[3] = -1  # no record: the router's own top-k
    taps.route(forced[:, None, :].expand(5, 2, 2).to(torch.int16), torch.ones(5, dtype=torch.bool), replay=True, measure=False)
    logits, weights, ids = router(hidden)
    own = torch.topk(torch.softmax(logits.float(), -1), 2).indices
    expected_ids = torch.where(forced >= 0, forced, own)
    assert torch.equal(ids, expected_ids)
    probs = torch.softmax(hidden @ router.weight.T, -1).gather(-1, expected_ids)
    torch.testing.assert_close(weights, probs / probs.sum(-1, keepdim=True))
    (weights * torch.randn_like(weights)).sum().backward()  # a plain sum of renormalised weights has no gradient
    assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0


def test_a_dense_model_is_refused_naming_the_flag(tmp_path_factory, tokenizer_path) -> None:
    from transformers import AutoModelForCausalLM

    from rlhf.errors import ConfigError
    from rlhf.testing.tiny import build_causal_lm

    path = build_causal_lm(tmp_path_factory.mktemp("dense"), tokenizer_path, hidden_size=64, layers=1)
    with pytest.raises(ConfigError, match="--actor.routing_replay rollout: the actor model .* has no top-k MoE router"):
        RoutingReplay("rollout").wrap(AutoModelForCausalLM.from_pretrained(path), "actor", PPOConfig())


def test_replayed_dumps_are_refused_with_rollout_replay_for_they_hold_no_routing_record(tmp_path_factory, tokenizer_path) -> None:
    from transformers import AutoModelForCausalLM

    from rlhf.errors import ConfigError

    model = AutoModelForCausalLM.from_pretrained(_model(tmp_path_factory, tokenizer_path, "olmoe"))
    config = PPOConfig()
    config.rollout.replay_dir = "dumped"
    with pytest.raises(ConfigError, match="--actor.routing_replay rollout: the rollouts --rollout.replay_dir trains on"):
        RoutingReplay("rollout").wrap(model, "actor", config)
    assert RoutingReplay("record").wrap(model, "actor", config) is model


def test_training_forwards_without_records_are_said_once_to_route_by_the_trainer_s_own_top_k(tmp_path_factory, tokenizer_path, caplog) -> None:
    """What a run whose engine records nothing (vLLM) gets with --actor.routing_replay rollout: one warning, not silence."""
    samples = [{"prompt_ids": [5, 9, 30], "response_ids": [41, 42]}, {"prompt_ids": [7, 8], "response_ids": [9]}]
    path = _model(tmp_path_factory, tokenizer_path, "olmoe")
    with caplog.at_level("WARNING", logger="rlhf.moe"):
        _, replay, model = _trainer_forward(path, "rollout", samples, training=False)
        assert not caplog.records  # log-prob passes say nothing: the training forwards of the step will
        for _ in range(2):
            before_forward([replay], model, ForwardTokens((2, 5), [0, 1], [0, 0], [5, 3], [None, None], True))
    assert [r.getMessage().split(":")[0] for r in caplog.records] == ["--actor.routing_replay rollout"]
    assert "no routing record" in caplog.records[0].getMessage()


def test_the_plan_counts_the_routing_record_of_one_forward_of_the_actor_and_the_reference(tmp_path_factory, tokenizer_path) -> None:
    from rlhf.planning import PlannedModel, model_shape

    path = _model(tmp_path_factory, tokenizer_path, "qwen3_moe")
    config = PPOConfig()
    config.actor.routing_replay, config.data.max_len = "rollout", 128
    config.train.micro_batch_size, config.rollout.micro_batch_size = 4, 8
    shape = model_shape(str(path), "--actor.model_name_or_path")
    replay = RoutingReplay.from_config(config)
    (actor,) = replay.plan_memory(config, PlannedModel("actor", shape, True, 1, shape.parameters, None))
    assert (actor.part, actor.nbytes) == ("routing record", 8 * 128 * 2 * 2 * 2)  # tokens x layers x top-2 x int16
    (ref,) = replay.plan_memory(config, PlannedModel("ref", shape, False, 1, 0, None))
    assert ref.nbytes == 8 * 128 * 2 * 2 * 2
    assert replay.plan_memory(config, PlannedModel("critic", shape, True, 1, shape.parameters, None)) == []


@pytest.fixture
def plugin_loads(monkeypatch: pytest.MonkeyPatch) -> list[tuple]:
    """Every ``PluginHost.load`` call from now on (each still loads)."""
    from rlhf.host.plugin_host import PluginHost

    loads: list[tuple] = []
    load = PluginHost.load
    monkeypatch.setattr(PluginHost, "load", lambda *args, **kwargs: loads.append(args) or load(*args, **kwargs))
    return loads


def test_an_engine_process_loads_plugins_only_for_a_run_that_sets_a_plugin_flag(plugin_loads: list[tuple]) -> None:
    from rlhf.models.extensions import engine_extensions

    assert engine_extensions(_config("off")) == [] and plugin_loads == []
    (built,) = engine_extensions(_config("rollout"))
    assert isinstance(built, RoutingReplay) and built.mode == "rollout" and len(plugin_loads) == 1


def test_the_in_rank_engine_records_with_its_rank_s_own_extensions(tmp_path_factory, tokenizer_path, plugin_loads) -> None:
    """What the actor worker does: the extensions it built as the model loaded go to the rank's engine, which builds
    and loads none of its own, and its records come through them."""
    import torch
    from rlhf_plugin_hf_generate.engine import InProcessHFEngine
    from transformers import AutoModelForCausalLM

    from rlhf.runtime.workers.policy import in_rank_engine
    from rlhf.testing.conformance.backends import WholeTrainedModel

    path = _model(tmp_path_factory, tokenizer_path, "qwen3_moe")
    worker_side = [RoutingReplay("rollout")]
    model = worker_side[0].wrap(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), "actor", PPOConfig())
    engine = in_rank_engine(InProcessHFEngine, WholeTrainedModel(model), worker_side, str(path), "fp32", 512, 0, _config("rollout"))
    assert engine.extensions is worker_side and plugin_loads == []
    assert [len(router._forward_hooks) for router in find_routers(model)] == [1, 1]
    (result,) = engine.generate([{"prompt_ids": [5, 9, 30], "max_tokens": 4, "seed": 3}], 1.0, 1.0)
    assert result["token_records"][RECORD].shape == (3 + len(result["response_ids"]) - 1, 2, 2)


@pytest.mark.parametrize("engine", [["--vllm.num_engines", "1"], ["--rollout.engine", "vllm-inprocess"]])
def test_replay_beside_an_engine_that_records_no_routes_is_refused_before_anything_starts(engine, tmp_path_factory,
                                                                                        tokenizer_path, tmp_path, capsys) -> None:
    """vLLM records no routes (its engine class sets no records_token_values): the run is refused in one line before a
    worker or an engine starts, where it used to train with a warning at the first forward and replay nothing."""
    from rlhf.cli.main import main

    (tmp_path / "prompts.jsonl").write_text('{"input": "what is 1+1?"}\n' * 4)
    model = _model(tmp_path_factory, tokenizer_path, "qwen3_moe")
    capsys.readouterr()
    code = main(["train", "ppo", "--actor.model_name_or_path", str(model), "--data.prompt_dataset",
                 str(tmp_path / "prompts.jsonl"), "--reward.functions", "format", "--actor.routing_replay", "rollout",
                 "--data.max_len", "128", "--ckpt.output_dir", str(tmp_path / "out"), *engine])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("rlhf: error: --actor.routing_replay rollout: the rollout engine 'vllm")
    assert "records_token_values" in err[0] and "--rollout.engine hf-inprocess or hf" in err[0]
