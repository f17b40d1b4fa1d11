"""``rlhf train kd`` end to end through the real CLI on CPU (ZeRO-3 over gloo): the one-rank runs in the test's own
process, the refused flag in a subprocess."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest

from rlhf.testing.cli import run_in_process, run_rlhf


def rlhf(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return run_rlhf(*args, timeout=timeout, env={"HF_DATASETS_OFFLINE": "1"})


def write_rows(path: Path, count: int, seed: int) -> Path:
    rng = random.Random(seed)
    with path.open("w") as handle:
        for _ in range(count):
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            handle.write(json.dumps({"input": f"what is {a}+{b}?", "output": f"the answer is {a + b}"}) + "\n")
    return path


def build_teacher(path: Path, tokenizer_path: Path, sharpness: float = 8.0) -> Path:
    """A second tiny causal LM (seed 5) whose logits are scaled up, so its distribution is far from uniform."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlhf.testing.tiny import build_causal_lm

    build_causal_lm(path, tokenizer_path, seed=5)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    with torch.no_grad():
        model.model.norm.weight.mul_(sharpness)  # logits = lm_head(norm(h)): scaled by `sharpness`
    model.save_pretrained(path)
    return path


def mean_kl(teacher_path: Path, student_path: Path, text: str) -> float:
    """Mean over the positions of ``text`` of KL(teacher ‖ student) of the next-token distributions."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ids = AutoTokenizer.from_pretrained(teacher_path)(text, return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logp = [torch.log_softmax(AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32)(ids).logits.double(), -1)
                for p in (teacher_path, student_path)]
    return float((logp[0].exp() * (logp[0] - logp[1])).sum(-1).mean())


@pytest.mark.slow
def test_kd_trains_student_towards_teacher(tmp_path, tiny_tokenizer_path, tiny_causal_lm_path) -> None:
    """12 steps of pure KD (α = 1) on ZeRO-3 with an offloaded teacher lower the logged KD term, and the saved
    student is closer to the teacher (held-out KL) than the starting model was."""
    teacher = build_teacher(tmp_path / "teacher", tiny_tokenizer_path)
    data = write_rows(tmp_path / "train.jsonl", 32, seed=0)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"
    result = run_in_process("train", "kd", "--model.model_name_or_path", str(tiny_causal_lm_path),
                            "--teacher.model_name_or_path", str(teacher), "--teacher.offload", "--data.dataset", str(data),
                            "--ds.zero_stage", "3", "--ds.param_dtype", "fp32", "--model.kd_coef", "1.0", "--adam.lr", "1e-3",
                            "--train.batch_size", "8", "--train.micro_batch_size", "4", "--train.max_epochs", "3",
                            "--ckpt.output_dir", str(out), "--ckpt.path", str(ckpt))
    assert result.returncode == 0, result.stderr[-4000:]
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == list(range(1, 13))
    assert all({"loss", "kd", "nll"} <= set(m) for m in metrics)
    assert all(m["loss"] == pytest.approx(m["kd"]) for m in metrics)  # α = 1
    kd = [m["kd"] for m in metrics]
    assert kd[-1] < kd[0] - 0.1, kd
    held_out = "User: what is 12+34?\nAssistant: the answer is 46"
    before, after = mean_kl(teacher, tiny_causal_lm_path, held_out), mean_kl(teacher, out, held_out)
    print(f"kd first/last {kd[0]:.4f}/{kd[-1]:.4f}; held-out KL before/after {before:.4f}/{after:.4f}")
    assert after < 0.9 * before, (before, after)


def test_teacher_flag_is_required(tmp_path, tiny_causal_lm_path) -> None:
    data = write_rows(tmp_path / "train.jsonl", 4, seed=1)
    result = rlhf("train", "kd", "--model.model_name_or_path", str(tiny_causal_lm_path), "--data.dataset", str(data),
                  "--ckpt.output_dir", str(tmp_path / "out"), timeout=120)
    assert result.returncode == 2, result.stderr[-4000:]
    assert "--teacher.model_name_or_path" in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_teacher_with_a_smaller_vocabulary_is_a_config_error(tmp_path, tiny_tokenizer_path, tiny_causal_lm_path) -> None:
    """Caught before the teacher's forward (whose embedding would index out of range): exit 2, the flag named."""
    from transformers import AutoModelForCausalLM

    from rlhf.testing.tiny import build_causal_lm

    teacher = build_causal_lm(tmp_path / "teacher", tiny_tokenizer_path, seed=5)
    model = AutoModelForCausalLM.from_pretrained(teacher)
    model.resize_token_embeddings(400)  # the tokenizer has 512 tokens
    model.save_pretrained(teacher)
    data = write_rows(tmp_path / "train.jsonl", 8, seed=2)
    result = run_in_process("train", "kd", "--model.model_name_or_path", str(tiny_causal_lm_path),
                            "--teacher.model_name_or_path", str(teacher), "--data.dataset", str(data), "--ds.param_dtype",
                            "fp32", "--train.batch_size", "8", "--train.micro_batch_size", "4", "--train.max_epochs", "1",
                            "--ckpt.output_dir", str(tmp_path / "out"), "--ckpt.path", str(tmp_path / "ckpt"))
    assert result.returncode == 2, result.stderr[-4000:]
    assert "--teacher.model_name_or_path" in result.stderr and "has 400 tokens but the student's has 512" in result.stderr
