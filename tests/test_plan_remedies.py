"""``rlhf plan``'s search tries what the components offer (their ``plan_remedies``): a third-party backend's and a
third-party engine's own flags end up in the verdict, FSDP2 offers its CPU offload, and the kit refuses a remedy that
is malformed or frees nothing it names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhf.cli.main import main
from rlhf.planning import MemoryPart, Remedy
from rlhf.testing.conformance import ConformanceFailure, check_backend_remedies, check_engine_remedies, ppo_config

BENCHMARK_CONFIGS = Path(__file__).resolve().parents[1] / "benchmarks" / "configs"
LLAMA_7B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
            "intermediate_size": 11008, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
            "vocab_size": 32000, "max_position_embeddings": 4096, "tie_word_embeddings": False}

#: a plain-torch-like backend of a third party: whole fp32 states on every rank, or its gradients and Adam on the CPU
#: under its own option, which only it knows
PLAIN_BACKEND = '''
import rlhf
from rlhf.config.base import Section, flag
from rlhf.planning import MemoryPart, Remedy

rlhf_plugin_api = 3


class PlainOptions(Section):
    cpu_states: bool = flag(False, "gradients and optimizer states on the CPU", switch=True)


class PlainBackend:
    @classmethod
    def plan_memory(cls, config, model):
        host = model.trained and PlainOptions.model_validate(config.plugins.get("plain", {})).cpu_states
        parts = [MemoryPart("weights", 4 * model.shape.parameters)]
        if model.trained:
            parts += [MemoryPart("gradients", 0 if host else 4 * model.trainable),
                      MemoryPart("optimizer states", 0 if host else model.optimizer_state_bytes)]
        return parts

    @classmethod
    def plan_remedies(cls, config, run):
        return [Remedy({"plain.cpu_states": True}, "offload", "the optimizer step on the CPU",
                       ("gradients", "optimizer states"))]


@rlhf.hookimpl
def rlhf_register_training_backends(register):
    register("plain", PlainBackend)


@rlhf.hookimpl
def rlhf_register_options(register):
    register(PlainOptions, namespace="plain")
'''


#: a third party's rollout engine with a KV cache of a fixed size under its own option, which only it can shrink
PAGED_ENGINE = '''
import rlhf
from rlhf.config.base import Section, flag
from rlhf.planning import MemoryPart, Remedy

rlhf_plugin_api = 3


class PagedOptions(Section):
    cache_gib: int = flag(40, "KV cache, GiB")


class PagedEngine:
    in_training_rank = False

    @classmethod
    def plan_memory(cls, config, shape, gpu_memory):
        cache = PagedOptions.model_validate(config.plugins.get("paged", {})).cache_gib << 30
        return [MemoryPart("weights", 2 * shape.parameters), MemoryPart("KV cache", cache)]

    @classmethod
    def plan_remedies(cls, config, run):
        return [Remedy({"paged.cache_gib": 4}, "generate in pieces", "fewer sequences sampled at once", ("KV cache",))]


@rlhf.hookimpl
def rlhf_register_rollout_engines(register):
    register("paged", PagedEngine)


@rlhf.hookimpl
def rlhf_register_options(register):
    register(PagedOptions, namespace="paged")
'''


@pytest.fixture(scope="module")
def llama7b(tmp_path_factory) -> str:
    directory = tmp_path_factory.mktemp("llama7b")
    (directory / "config.json").write_text(json.dumps(LLAMA_7B))
    return str(directory)


def plan(capsys, *argv: str, trainer: str = "sft") -> tuple[int, dict]:
    code = main(["plan", "train", trainer, *argv, "--json"])
    return code, json.loads(capsys.readouterr().out)


def test_a_third_party_backends_own_remedy_is_the_verdicts_fix(capsys, tmp_path: Path, llama7b: str) -> None:
    """SFT of a 7B model on one 48 GiB GPU with whole fp32 states (25 + 25 + 50 GiB): only the backend's own
    ``--plain.cpu_states`` fits, the search names it, and the run with it fits."""
    plugin = tmp_path / "plain.py"
    plugin.write_text(PLAIN_BACKEND)
    argv = ["--plugins", str(plugin), "--train.backend", "plain", "--model.model_name_or_path", llama7b,
            "--train.gradient_checkpointing_enable", "--train.micro_batch_size", "1", "--plan.gpus", "1",
            "--plan.gpu_memory", "48GiB"]
    code, out = plan(capsys, *argv)
    assert code == 1 and out["fix"] == "--plain.cpu_states", out["verdict"]
    assert out["verdict"].endswith("the first change that fits: --plain.cpu_states")
    code, out = plan(capsys, *argv, "--plain.cpu_states")
    assert code == 0 and out["fits"] is True
    assert {p["part"]: p["bytes"] for p in out["parts"]["model"]}["optimizer states"] == 0


def test_a_third_party_engines_own_remedy_is_the_verdicts_fix(capsys, tmp_path: Path) -> None:
    """PPO of Qwen2.5-0.5B with a third-party engine process whose 40 GiB cache overflows its 16 GiB GPU: the engine's
    own ``--paged.cache_gib 4`` is the first change that fits."""
    plugin = tmp_path / "paged.py"
    plugin.write_text(PAGED_ENGINE)
    argv = ["--plugins", str(plugin), "--rollout.engine", "paged", "--actor.model_name_or_path",
            str(BENCHMARK_CONFIGS / "qwen2.5-0.5b"), "--actor.num_gpus_per_node", "1", "--algo.kl.init_coef", "0",
            "--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "2", "--plan.gpus", "2",
            "--plan.gpu_memory", "16GiB"]
    code, out = plan(capsys, *argv, trainer="ppo")
    assert code == 1 and out["fix"] == "--paged.cache_gib 4", out["verdict"]
    code, out = plan(capsys, *argv, "--paged.cache_gib", "4", trainer="ppo")
    assert code == 0 and out["fits"] is True

def test_fsdp2_offers_its_cpu_offload_and_no_deepspeed_flag(capsys, llama7b: str) -> None:
    """FSDP2 on 8 GPUs of 12 GiB: its states (12.5 GiB a rank at 1/8 of fp32 weights, gradients and Adam) do not fit;
    the search names ``--fsdp2.cpu_offload``, never a ``--ds.*`` flag FSDP2 would refuse or ignore."""
    argv = ["--train.backend", "fsdp2", "--model.model_name_or_path", llama7b, "--train.gradient_checkpointing_enable",
            "--train.micro_batch_size", "1", "--plan.gpus", "8", "--plan.gpu_memory", "12GiB"]
    code, out = plan(capsys, *argv)
    assert code == 1 and out["fix"] == "--fsdp2.cpu_offload", out["verdict"]
    assert "--ds." not in out["verdict"]
    code, out = plan(capsys, *argv, "--fsdp2.cpu_offload")
    assert code == 0 and out["fits"] is True


def test_the_first_party_remedies_pass_the_kit() -> None:
    from rlhf_plugin_deepspeed.backend import DeepSpeedBackend
    from rlhf_plugin_fsdp2.backend import FSDP2Backend
    from rlhf_plugin_vllm.engine import VLLMEngine

    config = ppo_config()
    for stage in (0, 2):
        config.ds.zero_stage = stage
        check_backend_remedies(DeepSpeedBackend, config)
    check_backend_remedies(FSDP2Backend, config)
    check_engine_remedies(VLLMEngine, config)


class Lying:
    """Says that Adam on the CPU frees the optimizer states, but plans them on the GPU all the same."""

    @classmethod
    def plan_memory(cls, config, model):
        return [MemoryPart("optimizer states", 100)]

    @classmethod
    def plan_remedies(cls, config, run):
        return [Remedy({"ds.adam_offload": True}, "offload", "Adam on the CPU", ("optimizer states",))]


@pytest.mark.parametrize(("remedy", "message"), [
    (Remedy({"ds.adam_offload": True}, "cheap", "?"), "none of rlhf.planning.REMEDY_COSTS"),
    (Remedy({"ds.adam_offload": True}, "offload", ""), "a one-line reason"),
    (Remedy({"train.micro_batch_size": "many"}, "micro-batch", "a value its field refuses"),
     "do not apply to the run's config"),
    (Remedy({"ds.no_such_field": 1}, "offload", "a field the section lacks"), "do not apply to the run's config"),
])
def test_the_kit_refuses_a_malformed_remedy(remedy: Remedy, message: str) -> None:
    offering = type("Offering", (), {"plan_remedies": classmethod(lambda cls, config, run: [remedy])})
    with pytest.raises(ConformanceFailure, match=message):
        check_backend_remedies(offering, ppo_config())


def test_the_kit_refuses_a_remedy_that_frees_nothing_it_names() -> None:
    with pytest.raises(ConformanceFailure, match="it says it frees optimizer states"):
        check_backend_remedies(Lying, ppo_config())


def test_a_remedy_of_an_unknown_kind_is_one_line_naming_its_component(capsys, tmp_path: Path, llama7b: str) -> None:
    plugin = tmp_path / "plain.py"
    plugin.write_text(PLAIN_BACKEND.replace('"offload", "the optimizer step', '"cheap", "the optimizer step'))
    assert main(["plan", "train", "sft", "--plugins", str(plugin), "--train.backend", "plain",
                 "--model.model_name_or_path", llama7b, "--plan.gpus", "1", "--plan.gpu_memory", "48GiB"]) == 2
    err = capsys.readouterr().err
    assert err.count("rlhf: error:") == 1
    assert "PlainBackend.plan_remedies offered a change of kind 'cheap' (--plain.cpu_states)" in err
