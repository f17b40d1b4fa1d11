"""--ds.use_liger_kernel: a clear error on CPU machines; on a GPU the patched model keeps the HF numbers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from rlhf_plugin_liger.kernels import Liger

from rlhf.errors import ConfigError
from rlhf.testing.conformance import ppo_config


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-machine error")
def test_cpu_machine_gets_an_error_naming_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"--ds.use_liger_kernel: Liger's kernels are Triton GPU kernels .* no CUDA GPU"):
        Liger().prepare("actor", ppo_config())


@pytest.mark.gpu
@pytest.mark.timeout(90)  # Triton compiles Liger's kernels on the first call
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_patched_model_gives_the_same_logits(tiny_causal_lm_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    config = ppo_config()
    plain = AutoModelForCausalLM.from_pretrained(tiny_causal_lm_path, dtype=torch.float32).cuda()
    patched = AutoModelForCausalLM.from_pretrained(tiny_causal_lm_path, dtype=torch.float32).cuda()
    Liger().prepare("actor", config)
    patched = Liger().wrap(patched, "actor", config)
    assert type(patched.model.norm).__name__.startswith("Liger") or "Liger" in str(patched.model.norm.forward)
    ids = torch.randint(10, 300, (2, 24), device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(patched(ids).logits, plain(ids).logits, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-machine error")
def test_sft_with_liger_on_cpu_exits_2_naming_the_flag(tmp_path: Path, tiny_causal_lm_path: Path) -> None:
    from rlhf.testing.cli import run_rlhf

    data = tmp_path / "d.jsonl"
    data.write_text('{"input": "a", "output": "b"}\n' * 8)
    result = run_rlhf("train", "sft", "--model.model_name_or_path", str(tiny_causal_lm_path), "--data.dataset", str(data),
                      "--train.batch_size", "8", "--ds.param_dtype", "fp32", "--ds.use_liger_kernel",
                      "--ckpt.output_dir", str(tmp_path / "out"))
    assert result.returncode == 2, result.stderr[-2000:]
    assert "rlhf: error: --ds.use_liger_kernel: Liger's kernels are Triton GPU kernels" in result.stderr
