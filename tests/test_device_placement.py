"""Every tensor a model consumes is on that model's device: checked on CPU with a simulated accelerator.

On one H100 the default GRPO run died at its first training step: the worker packed its batch on the CPU and
fed it to a CUDA model. On a CPU machine that mistake is invisible, so these runs put every model on a simulated
accelerator (rlhf.testing.accelerator: the model reports ``meta`` as its device, refuses CPU inputs, and a CPU
tensor mixed into a loss raises as CUDA would) and train each trainer a step or two through the real runtime.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rlhf_plugin_deepspeed.backend import DeepSpeedBackend
from rlhf_plugin_hf_generate.engine import InProcessHFEngine
from rlhf_test_support import base_flags

from rlhf.records.metrics import read_metrics
from rlhf.testing.accelerator import MISMATCH, OnAccelerator, put_on_accelerator, simulated_accelerator
from rlhf.testing.cli import child_env

SIMULATED = ("--plugins", "rlhf.testing.simulated_backends")


class _Model:
    def __init__(self) -> None:
        self.module = torch.nn.Sequential(torch.nn.Embedding(10, 4), torch.nn.Linear(4, 3))
        self.device = torch.device("cpu")


def test_the_simulated_accelerator_refuses_what_a_gpu_refuses() -> None:
    """Inputs left on the CPU, CPU tensors mixed into device results and .numpy() of device tensors raise; moved
    inputs, CPU scalars, .cpu() and .tolist() work, and the numbers are the host computation's."""
    model = _Model()
    ids = torch.tensor([[1, 2, 3]])
    expected = 2 * model.module(ids).detach()
    put_on_accelerator(model)
    with simulated_accelerator():
        with pytest.raises(RuntimeError, match="same device.*input 'argument 0' of shape \\(1, 3\\) is on the CPU"):
            model.module(ids)
        out = model.module(ids.to(model.device))
        assert isinstance(out, OnAccelerator) and out.device == model.device == model.module.device
        with pytest.raises(RuntimeError, match="same device"):
            out * torch.ones(1, 3, 3)  # a loss term built on the CPU
        scaled = out * torch.tensor(2.0) + torch.zeros(1, 3, 3, device=model.device)
        assert scaled.device == model.device and scaled.cpu().device.type == "cpu"
        assert not isinstance(scaled.cpu(), OnAccelerator)
        with pytest.raises(TypeError, match="numpy"):
            scaled.numpy()
        values = scaled.tolist()
        scaled.sum().backward()  # gradients reach the parameters, which stay on the host
    assert torch.allclose(torch.tensor(values), expected)
    assert model.module[1].weight.grad is not None and model.module[1].weight.grad.abs().sum() > 0
    assert MISMATCH.startswith("Expected all tensors to be on the same device")


class ForgetfulModel:
    """A backend's model that adds ``position_ids`` built on the CPU: harmless on a CPU machine, a crash on a GPU."""

    def __call__(self, **inputs):
        width = inputs["input_ids"].shape[1]
        return super().__call__(position_ids=torch.arange(width)[None], **inputs)  # the mistake under test


class ForgetfulBackend(DeepSpeedBackend):
    def trained(self, *args, **kwargs):
        model = super().trained(*args, **kwargs)
        model.__class__ = type("Forgetful" + type(model).__name__, (ForgetfulModel, type(model)), {})
        return model


@pytest.mark.slow
def test_a_backend_that_builds_cpu_tensors_fails_its_kit(tiny_causal_lm_path, tmp_path) -> None:
    from rlhf.testing.conformance import ConformanceFailure
    from rlhf.testing.conformance.training import check_training_backend

    with pytest.raises(ConformanceFailure, match="device.*same device"):
        check_training_backend(ForgetfulBackend, tiny_causal_lm_path)


class CPUView:
    """The rank's model, but saying it is on the CPU: an engine reading its device then never moves its prompts."""

    def __init__(self, model) -> None:
        object.__setattr__(self, "model", model)

    def __getattr__(self, name):
        return getattr(self.model, name)

    def __setattr__(self, name, value) -> None:  # a view: what the engine sets (its generation config) is the model's
        setattr(self.model, name, value)

    def __call__(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    device = torch.device("cpu")


class ForgetfulEngine(InProcessHFEngine):
    def attach(self, trained) -> None:
        super().attach(trained)
        self._use(CPUView(trained.module))


def test_an_in_rank_engine_that_leaves_prompts_on_the_cpu_fails_its_kit(tiny_causal_lm_path) -> None:
    from rlhf.testing.conformance import ConformanceFailure
    from rlhf.testing.conformance.backends import check_rollout_engine

    with pytest.raises(ConformanceFailure, match="inputs on the trained model's device.*same device"):
        check_rollout_engine(ForgetfulEngine, tiny_causal_lm_path)


def _rl_flags(model: Path, task_files: dict[str, Path], run: Path, *extra: str) -> list[str]:
    return [*base_flags(model, task_files["prompts"], run, "hf", steps=2), "--reward.remote_url", str(task_files["reward"]),
            "--rollout.n_samples_per_prompt", "4", "--train.batch_size", "16", *extra]


GRPO = ("--algo.advantage.estimator", "group_norm", "--algo.kl.init_coef", "0.01", "--algo.kl.estimator", "k3",
        "--algo.kl.use_loss")


RL_RUNS = """
import sys
from rlhf.cli.main import main

for args in {runs!r}:
    if main(["--plugins", "rlhf.testing.simulated_backends", "train", "ppo", *args]) != 0:
        sys.exit(f"rlhf train ppo {{args}} failed")
"""


@pytest.mark.slow
def test_rl_trains_on_a_simulated_accelerator(tiny_causal_lm_path, task_files, tmp_path) -> None:
    """GRPO with the engine in the actor's rank (packed, token-budget micro-batches) and PPO with a critic, one process
    (the simulation stays entered in it): the actor, reference and critic workers, the in-rank engine and the losses
    keep every tensor on the model's device."""
    layouts = {
        "engine-in-rank": [*GRPO, "--rollout.engine", "hf-inprocess", "--ds.packing_samples", "--train.dynamic_batch_enable",
                           "--train.max_tokens_per_gpu", "64", "--rollout.max_tokens_per_gpu", "64"],
        "ppo-critic-in-rank": ["--algo.advantage.estimator", "gae", "--critic.model_name_or_path", str(tiny_causal_lm_path),
                               "--algo.kl.init_coef", "0.01"],
    }
    runs = [[*_rl_flags(tiny_causal_lm_path, task_files, tmp_path / name, *extra), "--train.backend", "simulated-deepspeed"]
            for name, extra in layouts.items()]
    result = subprocess.run([sys.executable, "-c", RL_RUNS.format(runs=runs)], capture_output=True, text=True,
                            env=child_env(RLHF_NO_PROGRESS="1", HF_HUB_OFFLINE="1"), timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    for name in layouts:
        metrics = read_metrics(tmp_path / name / "out")
        assert [m["step"] for m in metrics] == [1, 2], name
        assert all(torch.isfinite(torch.tensor(m["policy_loss"])) for m in metrics), name


@pytest.mark.slow
def test_rl_with_an_engine_process_and_a_reward_model_trains_on_a_simulated_accelerator(
        ray_cluster, tiny_causal_lm_path, tiny_reward_model_path, task_files, tmp_path) -> None:
    """Ranks on Ray workers, HF generate in an engine process of its own, a reward model beside the rule reward:
    every worker group enters the simulation as it builds its backend."""
    from rlhf.cli.main import main

    flags = _rl_flags(tiny_causal_lm_path, task_files, tmp_path, *GRPO, "--rollout.engine", "hf", "--train.in_process",
                      "off", "--reward.model_name_or_path", str(tiny_reward_model_path), "--train.backend",
                      "simulated-deepspeed")
    assert main([*SIMULATED, "train", "ppo", *flags]) == 0
    metrics = read_metrics(tmp_path / "out")
    assert [m["step"] for m in metrics] == [1, 2] and all("reward" in m for m in metrics)


SUPERVISED_RUNS = """
import sys
from rlhf.cli.main import main

common = ["--train.batch_size", "8", "--train.micro_batch_size", "4", "--ds.param_dtype", "fp32",
          "--data.max_samples", "16", "--train.backend", "simulated-deepspeed"]
for args in {runs!r}:
    if main(["--plugins", "rlhf.testing.simulated_backends", "train", *args, *common]) != 0:
        sys.exit(f"rlhf train {{args[0]}} failed")
"""


@pytest.mark.slow
def test_supervised_trainers_train_on_a_simulated_accelerator(tiny_causal_lm_path, tiny_tokenizer_path,
                                                              tmp_path) -> None:
    """SFT, RM, DPO, KTO, PRM and KD, one step each (KD with a teacher and KTO with a reference: frozen models too),
    in one process: every batch, label and loss term on the model's device."""
    from rlhf.testing.tiny import build_causal_lm

    rng = random.Random(0)
    rows = {"sft": [], "pairs": [], "kto": [], "prm": []}
    for i in range(16):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        rows["sft"].append({"input": f"what is {a}+{b}?", "output": str(a + b)})
        rows["pairs"].append({"prompt": f"what is {a}+{b}?", "chosen": str(a + b), "rejected": "no"})
        rows["kto"].append({"input": f"what is {a}+{b}?", "output": "yes" if i % 2 else "no", "label": i % 2 == 0})
        rows["prm"].append({"input": f"{a} plus {b} yes <|user|> is {a + b} no <|user|>", "label": ["+", "-"]})
    files = {}
    for name, items in rows.items():
        files[name] = tmp_path / f"{name}.jsonl"
        files[name].write_text("".join(json.dumps(r) + "\n" for r in items))
    teacher = build_causal_lm(tmp_path / "teacher", tiny_tokenizer_path, seed=5)
    model = ("--model.model_name_or_path", str(tiny_causal_lm_path))
    runs = [["sft", *model, "--data.dataset", str(files["sft"]), "--ds.packing_samples"],
            ["rm", *model, "--data.dataset", str(files["pairs"]), "--data.prompt_key", "prompt"],
            ["dpo", *model, "--data.dataset", str(files["pairs"]), "--data.prompt_key", "prompt"],
            ["kto", *model, "--data.dataset", str(files["kto"])],
            ["prm", *model, "--data.dataset", str(files["prm"]), "--model.placeholder_token", "<|user|>",
             "--model.reward_tokens", "+", "-"],
            ["kd", *model, "--data.dataset", str(files["sft"]), "--teacher.model_name_or_path", str(teacher)]]
    runs = [[*args, "--ckpt.output_dir", str(tmp_path / args[0])] for args in runs]
    result = subprocess.run([sys.executable, "-c", SUPERVISED_RUNS.format(runs=runs)], capture_output=True, text=True,
                            env=child_env(RLHF_NO_PROGRESS="1", HF_HUB_OFFLINE="1"), timeout=900)
    assert result.returncode == 0, result.stderr[-4000:]
    for args in runs:
        assert (tmp_path / args[0] / "metrics.jsonl").is_file(), args[0]
        assert (tmp_path / args[0] / "config.json").is_file(), args[0]
