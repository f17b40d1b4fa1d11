"""``rlhf plan``: model shapes from config.json on the meta device, the byte formulas against hand computation and
DeepSpeed's own estimators, the verdict and the first change that fits, and the CLI's output and exit codes."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from rlhf.cli.main import main
from rlhf.planning import ModelShape, PlannedModel, activation_bytes, model_shape, parse_bytes, zero_model_states

LLAMA_7B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
            "intermediate_size": 11008, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
            "vocab_size": 32000, "max_position_embeddings": 4096, "tie_word_embeddings": False}
LLAMA3_70B = {**LLAMA_7B, "hidden_size": 8192, "intermediate_size": 28672, "num_attention_heads": 64,
              "num_hidden_layers": 80, "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192}


def write_config(directory: Path, fields: dict) -> str:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(fields))
    return str(directory)


@pytest.fixture(scope="module")
def llama7b(tmp_path_factory) -> str:
    return write_config(tmp_path_factory.mktemp("llama7b"), LLAMA_7B)


@pytest.fixture(scope="module")
def llama70b(tmp_path_factory) -> str:
    return write_config(tmp_path_factory.mktemp("llama70b"), LLAMA3_70B)


def test_parameter_counts_of_published_llama_configs(llama7b, llama70b):
    """Llama-2-7B has 6,738,415,616 parameters and Llama-3-70B 70,553,706,496 (their model cards' safetensors
    totals); both built on the meta device from config.json alone, with no weights in the directory."""
    assert model_shape(llama7b, "--x").parameters == 6_738_415_616
    shape = model_shape(llama70b, "--x")
    assert shape.parameters == 70_553_706_496
    assert (shape.layers, shape.kv_heads, shape.head_dim) == (80, 8, 128)
    assert shape.largest_layer == 128256 * 8192  # the embedding is larger than one decoder layer
    assert shape.lora_parameters(8, "all-linear") == 8 * 80 * (2 * (8192 + 8192) + 2 * (8192 + 1024)
                                                               + 3 * (8192 + 28672))


def random_model(rng: random.Random, trained: bool = True) -> PlannedModel:
    parameters = rng.randrange(10**8, 10**11)
    shape = ModelShape("x", parameters, rng.randrange(10**6, 10**9), 32, 4096, 11008, 32, 8, 128, 32000, 0, 0)
    return PlannedModel("actor", shape, trained, rng.choice([1, 2, 8, 64]), parameters, 8 * parameters)


def test_zero_model_states_equal_deepspeed_estimators():
    """Sum of the planned weights, gradients, optimizer states and gather buffer on one GPU = DeepSpeed's
    estimate_zero2/3_model_states_mem_needs' GPU figure, with and without optimizer offload (to its int rounding)."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    rng = random.Random(47)
    for _ in range(30):
        model, offload = random_model(rng), rng.random() < 0.5
        p, n = model.shape.parameters, model.ranks
        total2 = sum(part.nbytes for part in zero_model_states(model, 2, 2, offload))
        gpu2 = estimate_zero2_model_states_mem_needs(p, n, 1, cpu_offload=offload)[1]
        total3 = sum(part.nbytes for part in zero_model_states(model, 2, 3, offload))
        gpu3 = estimate_zero3_model_states_mem_needs(p, model.shape.largest_layer, n, 1, cpu_offload=offload,
                                                           cpu_offload_params=False)[1]
        assert abs(total2 - gpu2) <= 2 and abs(total3 - gpu3) <= 2, (p, n, offload)


def test_inference_model_holds_weights_only_and_stage0_holds_everything():
    model = random_model(random.Random(1))
    p = model.shape.parameters
    frozen = PlannedModel("ref", model.shape, False, 4, 0, None)
    assert sum(x.nbytes for x in zero_model_states(frozen, 2, 0, False)) == 2 * p
    assert sum(x.nbytes for x in zero_model_states(model, 2, 0, False)) == 2 * p + 2 * p + 16 * p
    fp32 = sum(x.nbytes for x in zero_model_states(model, 4, 1, False))
    assert fp32 == 4 * p + 4 * p + 8 * p // model.ranks  # no master copy: the weights are fp32 already


def test_activation_bytes_against_hand_computation():
    rng = random.Random(7)
    for _ in range(20):
        h, i, layers, heads, kv, vocab = (rng.choice([64, 512, 4096]), rng.choice([128, 11008]), rng.randrange(1, 80),
                                          8, rng.choice([1, 8]), rng.randrange(100, 200000))
        shape = ModelShape("x", 1, 1, layers, h, i, heads, kv, h // heads, vocab, 0, 0)
        tokens, seq, d = rng.randrange(1, 9000), rng.randrange(1, 4096), rng.choice([2, 4])
        per_layer = d * (6 * h + 2 * kv * (h // heads) + 4 * i)
        assert activation_bytes(shape, tokens, seq, d, checkpointing=False, eager_attention=False, logits=True) == \
            tokens * (layers * per_layer + 8 * vocab)
        assert activation_bytes(shape, tokens, seq, d, checkpointing=True, eager_attention=True, logits=True,
                                fused_logits=True) == tokens * (layers * d * h + per_layer + 2 * d * heads * seq)
        assert activation_bytes(shape, tokens, seq, d, checkpointing=False, eager_attention=False, logits=False,
                                backward=False) == tokens * per_layer


def test_parse_bytes():
    assert parse_bytes("80GiB") == parse_bytes("80 GB") == parse_bytes("80G") == 80 * 2**30
    assert parse_bytes("1.5TiB") == int(1.5 * 2**40) and parse_bytes("1024") == 1024
    with pytest.raises(ValueError):
        parse_bytes("eighty")


def plan(capsys, *argv: str, trainer: str = "ppo") -> tuple[int, dict]:
    code = main(["plan", "train", trainer, *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_seventy_b_on_eight_a100_does_not_fit_and_names_why(capsys, llama70b):
    """OpenRLHF's claim: 70B PPO on 8 A100-80G without offload does not fit; the plan names the GPU and parts."""
    code, out = plan(capsys, "--actor.model_name_or_path", llama70b, "--train.colocate_all", "--vllm.num_engines", "2",
                     "--vllm.tensor_parallel_size", "4", "--ds.zero_stage", "3", "--actor.gradient_checkpointing_enable",
                     "--plan.gpus", "8", "--plan.gpu_memory", "80GiB")
    assert code == 1 and out["fits"] is False
    assert "does not fit: node 0 GPU 0" in out["verdict"] and "actor optimizer states" in out["verdict"]
    assert all(gpu["peak"] > 80 * 2**30 for gpu in out["gpus"])


def test_openrlhf_quick_start_fits_and_placement_is_the_hybrid_engine(capsys, tmp_path):
    """OpenRLHF's README quick start: Llama-3-8B, hybrid engine on 8 A100-80G, gpu_memory_utilization 0.5, sleep."""
    model = write_config(tmp_path / "llama3-8b", {**LLAMA_7B, "hidden_size": 4096, "intermediate_size": 14336,
                                                  "num_key_value_heads": 8, "vocab_size": 128256})
    code, out = plan(capsys, "--actor.model_name_or_path", model, "--reward.model_name_or_path", model,
                     "--train.colocate_all", "--vllm.num_engines", "8", "--vllm.gpu_memory_utilization", "0.5",
                     "--vllm.enable_sleep", "--ds.enable_sleep", "--ds.zero_stage", "3",
                     "--actor.gradient_checkpointing_enable", "--algo.advantage.estimator", "reinforce_baseline", "--rollout.n_samples_per_prompt", "4",
                     "--data.max_len", "2048", "--plan.gpus", "8", "--plan.gpu_memory", "80GiB")
    assert code == 0 and out["fits"] is True, out["verdict"]
    assert [gpu["holds"] for gpu in out["gpus"]] == [[f"actor rank {r}", f"ref rank {r}", f"reward rank {r}", f"engine {r}"]
                                                    for r in range(8)]
    engine = {p["part"]: p for p in out["parts"]["engine"]}
    assert engine["KV cache"]["away_in"] == ["train"]
    assert engine["weights"]["bytes"] + engine["KV cache"]["bytes"] == int(0.5 * 80 * 2**30)


def test_first_fitting_change_and_train_refuses_with_the_plan_line(capsys, llama7b):
    """7B on 24 GB GPUs: the plan names --ds.adam_offload (the first change that fits, the "7B on RTX 4090s with Adam
    on the CPU" claim); rlhf train stops with the same line (exit 2), and --plan.ignore lets it through."""
    argv = ["--actor.model_name_or_path", llama7b, "--actor.num_gpus_per_node", "4", "--ds.zero_stage", "2",
            "--actor.gradient_checkpointing_enable", "--algo.advantage.estimator", "reinforce_baseline", "--rollout.n_samples_per_prompt", "4",
            "--algo.kl.init_coef", "0", "--vllm.num_engines", "2", "--plan.gpus", "6", "--plan.gpu_memory", "24GiB"]
    code, out = plan(capsys, *argv)
    assert code == 1 and out["fix"] == "--ds.adam_offload"
    code, out = plan(capsys, *argv, "--ds.adam_offload")
    assert code == 0 and out["fits"] is True
    assert main(["train", "ppo", *argv, "--print-config"]) == 2
    assert "rlhf: error: the plan does not fit" in capsys.readouterr().err
    assert main(["train", "ppo", *argv, "--print-config", "--plan.ignore"]) == 0
    capsys.readouterr()


def test_train_on_a_machine_without_gpus_is_not_refused_and_plan_prints(capsys, llama70b):
    argv = ["--actor.model_name_or_path", llama70b, "--actor.num_gpus_per_node", "1"]
    assert main(["train", "ppo", *argv, "--print-config"]) == 0
    assert "actor:" in capsys.readouterr().out
    assert main(["train", "ppo", *argv, "--plan"]) == 0
    out = capsys.readouterr().out
    assert "Memory per GPU" in out and "memory not checked" in out


def test_component_without_plan_memory_is_not_estimated(capsys, llama7b, monkeypatch):
    from rlhf_plugin_deepspeed.backend import DeepSpeedBackend

    monkeypatch.delattr(DeepSpeedBackend, "plan_memory")
    code, out = plan(capsys, "--actor.model_name_or_path", llama7b, "--vllm.num_engines", "1", "--plan.gpus", "32",
                     "--plan.gpu_memory", "80GiB")
    assert out["parts"]["actor"][0] == {"part": "model states", "bytes": None, "note": "--train.backend deepspeed does "
                                        "not say", "away_in": []}
    assert "not estimated: actor model states" in out["verdict"]


def test_supervised_trainers_hold_every_model_on_every_gpu(capsys, llama7b):
    """DPO: one process per GPU holds the trained model and its reference; RM: the value head replaces the LM head."""
    code, out = plan(capsys, "--model.model_name_or_path", llama7b, "--plan.gpus", "8", "--plan.gpu_memory", "80GiB",
                     "--ds.zero_stage", "3", "--train.gradient_checkpointing_enable", "--train.micro_batch_size", "1",
                     trainer="dpo")
    assert code == 0 and out["fits"] is True
    assert [gpu["holds"] for gpu in out["gpus"]] == [[f"model rank {r}", f"ref rank {r}"] for r in range(8)]
    code, out = plan(capsys, "--model.model_name_or_path", llama7b, "--plan.gpus", "1", trainer="rm")
    assert code == 0 and out["fits"] is None  # no GPU memory given: not checked
    assert out["parts"]["model"][0]["bytes"] == 2 * (6_738_415_616 - 32000 * 4096 + 4096)


def test_conformance_checks_of_the_plan_methods():
    """FSDP2's plan_memory (it has no kit) passes; a plan that grows with the ranks or counts negative bytes fails."""
    from rlhf_plugin_fsdp2.backend import FSDP2Backend

    from rlhf.planning import MemoryPart
    from rlhf.testing.conformance import ConformanceFailure, check_backend_plan, ppo_config

    check_backend_plan(FSDP2Backend, ppo_config())

    class Growing:
        @classmethod
        def plan_memory(cls, config, model):
            return [MemoryPart("weights", model.ranks)]

    class Negative:
        @classmethod
        def plan_memory(cls, config, model):
            return [MemoryPart("weights", -1)]

    with pytest.raises(ConformanceFailure, match="8 ranks hold more per GPU"):
        check_backend_plan(Growing, ppo_config())
    with pytest.raises(ConformanceFailure, match="a count >= 0 or None"):
        check_backend_plan(Negative, ppo_config())


def test_a_cluster_on_paper_too_small_names_the_colocation_that_places_the_run(capsys, llama7b):
    """PPO's default groups (actor, ref, critic: 8 ranks each) and one engine on 17 GPUs: the GPU-count check's line,
    and the first colocation with which the run can be placed (memory unknown: only the placement is checked)."""
    code, out = plan(capsys, "--actor.model_name_or_path", llama7b, "--vllm.num_engines", "1", "--plan.gpus", "17")
    assert code == 1 and out["fits"] is False
    # the cluster exists only on paper (issue 61): not "the Ray cluster"; and the groups left out of the table are named
    assert out["placement_problem"].startswith("this run needs 25 GPUs and the planned cluster has 17")
    held = [seat for gpu in out["gpus"] for seat in gpu["holds"]]
    critics = sum(seat.startswith("critic rank") for seat in held)
    assert f"(left out of the placement below: critic ({8 - critics} of 8 ranks), engines (1 of 1 bundles))" in \
        out["placement_problem"] and critics < 8
    assert out["fix"] == "--train.colocate_actor_ref"


def test_finer_colocation_places_the_engines_with_the_group_named(capsys, llama7b):
    """--train.colocate ref+engines: engine i on the reference's GPU i, the actor on GPUs of its own; the ipc
    transport (engines on the actor's GPUs) refuses it, NCCL broadcast refuses an engine on a training GPU."""
    from rlhf_plugin_torch_sync.broadcast import NcclBroadcast
    from rlhf_plugin_vllm.ipc import IpcTransport

    from rlhf.testing.conformance import ppo_config

    code, out = plan(capsys, "--actor.model_name_or_path", llama7b, "--actor.num_gpus_per_node", "2",
                     "--ref.num_gpus_per_node", "2", "--vllm.num_engines", "2", "--algo.advantage.estimator",
                     "reinforce", "--train.colocate", "ref+engines", "--plan.gpus", "4")
    assert [gpu["holds"] for gpu in out["gpus"]] == [["actor rank 0"], ["actor rank 1"], ["ref rank 0", "engine 0"],
                                                    ["ref rank 1", "engine 1"]]
    config = ppo_config()
    config.vllm.num_engines = 2
    config.train.colocate = ["ref+engines"]
    assert "not on the actor's GPUs" in IpcTransport.unavailable_reason(config, cuda=True)
    assert "NCCL refuses two ranks on one GPU" in NcclBroadcast.unavailable_reason(config, cuda=True)
    config.train.colocate = ["actor+engines"]
    assert IpcTransport.unavailable_reason(config, cuda=True) is None


@pytest.mark.parametrize("entry", ["actor", "actor+policy", "actor+engines actor+ref"])
def test_a_bad_colocation_is_one_line(capsys, llama7b, entry):
    assert main(["plan", "train", "ppo", "--actor.model_name_or_path", llama7b, "--train.colocate", *entry.split()]) == 2
    err = capsys.readouterr().err
    assert err.count("rlhf: error:") == 1 and "--train.colocate" in err


def test_logits_parts_against_hand_computation(monkeypatch):
    """The training logits (micro-batch x sequence x vocab in the weights' dtype, twice with their gradient; an
    experience forward's where larger), one fp32 log-prob chunk (2 copies) of LOGPROB_CHUNK_TOKENS positions at most
    and no more than a forward's sequences x response tokens; none for a value head."""
    from rlhf import ops
    from rlhf.runtime.plan.plan import logits_parts
    from rlhf.testing.conformance import ppo_config

    rng = random.Random(57)
    for _ in range(40):
        chunk = rng.choice([64, 1024, 4096])
        monkeypatch.setattr(ops, "LOGPROB_CHUNK_TOKENS", chunk)
        train_mb, rollout_mb, length, vocab = rng.randrange(1, 9), rng.randrange(1, 33), rng.randrange(8, 9000), rng.randrange(100, 200000)
        response = rng.randrange(1, length)
        dtype, d = rng.choice([("bf16", 2), ("fp32", 4)])
        config = ppo_config(train={"micro_batch_size": train_mb}, rollout={"micro_batch_size": rollout_mb},
                            data={"max_len": length}, ds={"param_dtype": dtype})
        shape = ModelShape("x", 1, 1, 2, 64, 128, 8, 8, 8, vocab, 0, 0)
        actor = {p.part: p.nbytes for p in logits_parts(config, PlannedModel("actor", shape, True, 8, 1, 8), response)}
        ref = {p.part: p.nbytes for p in logits_parts(config, PlannedModel("ref", shape, False, 8, 0, None), response)}
        assert actor["logits"] == max(2 * train_mb, rollout_mb) * length * vocab * d
        assert ref["logits"] == rollout_mb * length * vocab * d
        assert actor["log-prob chunk"] == 2 * min(chunk, max(train_mb, rollout_mb) * response) * vocab * 4
        assert ref["log-prob chunk"] == 2 * min(chunk, rollout_mb * response) * vocab * 4
        assert logits_parts(config, PlannedModel("critic", shape.value_model(), True, 8, 1, 8), response) == []


def test_response_tokens_bound_the_chunk_only_for_one_generation_per_request():
    """A single-turn run's responses are at most --rollout.max_new_tokens (and --data.max_len less a prompt token);
    a multi-turn trajectory spans several generations, bounded by --data.max_len only; without the flag, the same."""
    from rlhf.host.plugin_host import PluginHost
    from rlhf.runtime.plan.plan import response_tokens
    from rlhf.testing.conformance import ppo_config

    registry = PluginHost.load().registry
    rng = random.Random(61)
    for _ in range(10):
        length, new = rng.randrange(2, 5000), rng.randrange(1, 6000)
        single = ppo_config(data={"max_len": length}, rollout={"max_new_tokens": new}, train={"agent_executor": "single_turn"})
        multi = ppo_config(data={"max_len": length}, rollout={"max_new_tokens": new}, train={"agent_executor": "multi_turn"})
        unset = ppo_config(data={"max_len": length}, rollout={"max_new_tokens": None}, train={"agent_executor": "single_turn"})
        assert response_tokens(single, registry) == min(new, length - 1)
        assert response_tokens(multi, registry) == response_tokens(unset, registry) == length - 1


def test_sequence_is_capped_at_max_position_embeddings(capsys, llama7b):
    """Llama-2-7B's 4096 positions: --data.max_len 8192 is planned at 4096 tokens, as the run caps it, and said."""
    argv = ["--actor.model_name_or_path", llama7b, "--actor.num_gpus_per_node", "1", "--algo.kl.init_coef", "0",
            "--algo.advantage.estimator", "reinforce", "--vllm.num_engines", "1", "--plan.gpus", "2"]
    _, out = plan(capsys, *argv, "--data.max_len", "8192")
    _, at_limit = plan(capsys, *argv, "--data.max_len", "4096")
    assert out["parts"] == at_limit["parts"] and {p["note"] for p in out["parts"]["actor"]} >= {"4096 tokens"}
    assert out["notes"] == ["--data.max_len 8192 is more than the actor's max_position_embeddings 4096: planned at "
                            "4096, as the run caps it"] and at_limit["notes"] == []


def test_search_finds_a_pair_when_no_single_change_fits(capsys, llama7b):
    """SFT of a 7B model on 8 GPUs of 12 GiB at ZeRO-2: ZeRO-3 alone (16.9 GiB) and Adam on the CPU alone (14.6 GiB)
    do not fit, the two together (4.4 GiB) do; and the flags named fit when given."""
    argv = ["--model.model_name_or_path", llama7b, "--ds.zero_stage", "2", "--train.gradient_checkpointing_enable",
            "--train.micro_batch_size", "1", "--plan.gpus", "8", "--plan.gpu_memory", "12GiB"]
    code, out = plan(capsys, *argv, trainer="sft")
    assert code == 1 and out["fix"] == "--ds.zero_stage 3 --ds.adam_offload"
    for single in (["--ds.zero_stage", "3"], ["--ds.adam_offload"]):
        assert plan(capsys, *argv, *single, trainer="sft")[1]["gpus"][0]["peak"] > 12 * 2**30
    code, out = plan(capsys, *argv, "--ds.zero_stage", "3", "--ds.adam_offload", trainer="sft")
    assert code == 0 and out["fits"] is True


def test_nothing_fits_names_the_closest(capsys, llama70b):
    """A 70B SFT on 8 GPUs of 8 GiB: nothing tried fits, and the verdict names the change whose fullest GPU is least
    over, with that GPU's bytes, which no other single change beats."""
    argv = ["--model.model_name_or_path", llama70b, "--ds.zero_stage", "2", "--plan.gpus", "8", "--plan.gpu_memory", "8GiB"]
    code, out = plan(capsys, *argv, trainer="sft")
    assert code == 1 and out["fix"] is None
    assert re.search(r"; none of the \d+ changes and pairs of changes tried fits; the closest: ", out["verdict"])
    flags, _, needs = out["closest"].partition(" (node 0 GPU 0 needs ")
    closest = plan(capsys, *argv, *flags.split(), trainer="sft")[1]["gpus"][0]["peak"]
    from rlhf.planning import format_bytes

    assert needs == f"{format_bytes(closest)} of 8.0 GiB)"
    for single in (["--ds.zero_stage", "3"], ["--ds.adam_offload"], ["--train.gradient_checkpointing_enable"]):
        assert plan(capsys, *argv, *single, trainer="sft")[1]["gpus"][0]["peak"] >= closest


BENCHMARK_CONFIGS = Path(__file__).resolve().parents[1] / "benchmarks" / "configs"
ISSUE_57_RUN = ["--actor.num_gpus_per_node", "8", "--algo.advantage.estimator", "group_norm",
                "--rollout.n_samples_per_prompt", "8", "--data.max_len", "2048", "--actor.gradient_checkpointing_enable",
                "--algo.kl.init_coef", "0", "--ds.zero_stage", "3", "--plan.gpus", "8", "--plan.gpu_memory", "80GiB"]


def test_issue_57_configs_fit_on_eight_gpus_or_the_verdict_names_a_change_that_does(capsys):
    """GRPO of the four published configs (Qwen2.5-0.5B, Qwen2.5-7B, Llama-2-7B, Qwen3-30B-A3B) on 8 x 80 GiB with
    --vllm.num_engines 0: each fits as it stands (ZeRO-3 ranks generate in place, one chunk at a time); with an HF
    engine process of its own (--rollout.engine hf: a ninth GPU) the verdict names a change with which it fits."""
    for name in ("qwen2.5-0.5b", "qwen2.5-7b", "llama-2-7b", "qwen3-30b-a3b"):
        argv = ["--actor.model_name_or_path", str(BENCHMARK_CONFIGS / name), *ISSUE_57_RUN, "--vllm.num_engines", "0"]
        code, out = plan(capsys, *argv)
        assert code == 0 and out["fits"] is True, (name, out["verdict"])
        code, out = plan(capsys, *argv, "--rollout.engine", "hf")
        assert code == 1 and out["fix"], (name, out["verdict"])
        code, fixed = plan(capsys, *argv, *out["fix"].split())
        assert code == 0 and fixed["fits"] is True, (name, out["fix"], fixed["verdict"])


def test_a_replayed_run_plans_no_engine(capsys, tmp_path, tiny_tokenizer_path):
    """--rollout.replay_dir: nothing generates, so the plan places no engine and counts no engine memory."""
    import shutil

    from rlhf.models.loading import load_tokenizer
    from rlhf.records.rollouts import SCHEMA, RolloutDump, tokenizer_fingerprint

    model = Path(write_config(tmp_path / "llama7b", LLAMA_7B))
    for file in tiny_tokenizer_path.iterdir():
        shutil.copy(file, model)
    fingerprint = tokenizer_fingerprint(load_tokenizer(str(model), "--actor.model_name_or_path"))
    RolloutDump(tmp_path / "dump").write(1, [{"step": 1}], {"schema": SCHEMA, "actor": str(model), "tokenizer": fingerprint})
    flags = ["--actor.model_name_or_path", str(model), "--actor.num_gpus_per_node", "2", "--vllm.num_engines", "2",
             "--algo.advantage.estimator", "reinforce", "--algo.kl.init_coef", "0", "--plan.gpus", "4"]
    _, generating = plan(capsys, *flags)
    assert [gpu["holds"] for gpu in generating["gpus"]][2:] == [["engine 0"], ["engine 1"]] and "engine" in generating["parts"]
    _, replayed = plan(capsys, *flags, "--rollout.replay_dir", str(tmp_path / "dump"))
    assert [gpu["holds"] for gpu in replayed["gpus"] if gpu["holds"]] == [["actor rank 0"], ["actor rank 1"]]
    assert "engine" not in replayed["parts"]


def test_the_plan_counts_what_each_kind_of_layer_keeps_while_it_generates(tmp_path: Path) -> None:
    """Qwen3.5's Gated DeltaNet layers keep a fixed state per sequence instead of K and V per token, gpt-oss's and
    Gemma-3's sliding-window layers keep the window's; a dense model keeps every token in every layer. The HF engine's
    planned KV cache is the sum for its chunk."""
    import transformers
    from rlhf_plugin_hf_generate.engine import HFEngine

    from rlhf.testing.conformance import ppo_config

    rng = random.Random(0)
    small = {"hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 2, "num_key_value_heads": 1,
             "head_dim": 32, "vocab_size": 512, "max_position_embeddings": 4096}
    keys, values, kernel = rng.choice([16, 32]), rng.choice([16, 32]), rng.choice([2, 4])
    hybrid = transformers.Qwen3_5TextConfig(
        **small, num_hidden_layers=4, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=keys,
        linear_value_head_dim=values, linear_conv_kernel_dim=kernel,
        layer_types=["linear_attention"] * 3 + ["full_attention"])
    window = rng.randrange(8, 64)
    sliding = transformers.GptOssConfig(**small, num_hidden_layers=2, num_local_experts=4, num_experts_per_tok=2,
                                        sliding_window=window, layer_types=["sliding_attention", "full_attention"])
    dense = transformers.LlamaConfig(**small, num_hidden_layers=2)
    shapes = {}
    for name, config in {"hybrid": hybrid, "sliding": sliding, "dense": dense}.items():
        config.save_pretrained(tmp_path / name)
        shapes[name] = model_shape(str(tmp_path / name), "--actor.model_name_or_path")
    per_layer_token = 2 * 1 * 32 * 2  # K and V, one KV head of 32, bf16
    sequences, length = rng.randrange(1, 16), rng.randrange(window + 1, 2048)
    state = 4 * keys * values + (2 * 2 * keys + 4 * values) * kernel  # per value head k x v, and the conv window
    assert shapes["hybrid"].kv_bytes_per_token(2) == per_layer_token
    assert shapes["hybrid"].kv_cache_bytes(2, sequences, length) == sequences * (per_layer_token * length + 3 * state * 2)
    assert shapes["sliding"].kv_cache_bytes(2, sequences, length) == sequences * per_layer_token * (length + window)
    assert shapes["dense"].kv_cache_bytes(2, sequences, length) == sequences * per_layer_token * 2 * length
    config = ppo_config(rollout={"micro_batch_size": sequences, "batch_size": 64}, data={"max_len": length},
                        ds={"param_dtype": "bf16"})
    (cache,) = [part for part in HFEngine.plan_memory(config, shapes["hybrid"], None) if part.part == "KV cache"]
    assert cache.nbytes == shapes["hybrid"].kv_cache_bytes(2, sequences, length)
