"""The offline tiny fixtures load in transformers and train under DeepSpeed ZeRO-3. That the tiny causal LM generates in
vLLM with HF's log-probs is checked on the vLLM engine tests/test_weight_sync.py already runs
(``_assert_vllm_samples_with_the_logprobs_of_hf``), not in a vLLM process of its own."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

CHECKS = Path(__file__).parent / "engine_checks"


def run_check(script: str, *args: str, timeout: int = 300) -> dict:
    from rlhf.distributed import free_port
    from rlhf.testing.cli import child_env

    env = child_env(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", MASTER_PORT=str(free_port()))
    result = subprocess.run([sys.executable, str(CHECKS / script), *args], capture_output=True, text=True,
                            timeout=timeout, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_tokenizer_has_special_tokens_and_a_chat_template(tiny_tokenizer_path: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_tokenizer_path)
    assert len(tok) == 512
    assert (tok.bos_token, tok.eos_token, tok.pad_token, tok.unk_token) == ("<s>", "</s>", "<pad>", "<unk>")
    text = tok.apply_chat_template([{"role": "user", "content": "12+34="}], add_generation_prompt=True, tokenize=False)
    assert text == "<|user|>12+34=</s><|assistant|>"
    assert tok.decode(tok("47+85=132")["input_ids"]) == "47+85=132"


def test_causal_lm_and_reward_model_load_and_run(tiny_causal_lm_path: Path, tiny_reward_model_path: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    lm = AutoModelForCausalLM.from_pretrained(tiny_causal_lm_path)
    ids = torch.randint(10, 500, (2, 7))
    assert lm(ids).logits.shape == (2, 7, 512)
    assert 200_000 < sum(p.numel() for p in lm.parameters()) < 1_000_000
    rm = AutoModelForSequenceClassification.from_pretrained(tiny_reward_model_path)
    assert rm.score.out_features == 1
    assert rm(ids).logits.shape == (2, 1)


def test_qwen2_family_builds(tmp_path: Path, tiny_tokenizer_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from rlhf.testing import build_causal_lm

    model = AutoModelForCausalLM.from_pretrained(build_causal_lm(tmp_path / "qwen", tiny_tokenizer_path, family="qwen2"))
    assert model.config.model_type == "qwen2"


@pytest.mark.slow
def test_tiny_model_trains_under_deepspeed_zero3(tiny_causal_lm_path: Path) -> None:
    summary = run_check("deepspeed_zero3_step.py", str(tiny_causal_lm_path))
    assert summary["zero_stage"] == 3
    losses = summary["losses"]
    assert losses[-1] < losses[0] - 0.5, losses
