"""rlhf train sft: the loss formula, the exact global token mean of one optimizer step, LoRA + merge."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from rlhf_plugin_sft.trainer import nll_sum
from rlhf_supervised.batch import collate, token_logprobs
from rlhf_supervised.config import SupervisedDataSection
from rlhf_supervised.conversations import pretrain_text, prompt_response
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlhf.testing.cli import assert_ok, assert_user_error, refused_in_process, run_in_process, run_rlhf


def write_rows(path: Path, count: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    with path.open("w") as handle:
        for _ in range(count):
            a, b = rng.randint(1, 99), rng.randint(1, 99)
            answer = " ".join(["so"] * rng.randint(0, 6)) + f" {a + b}"  # responses of different lengths
            handle.write(json.dumps({"input": f"what is {a}+{b}?", "output": answer}) + "\n")
    return path


def test_nll_sum_matches_cross_entropy_on_random_logits() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 9, 17, generator=gen)
    seqs = [torch.randint(0, 17, (n,), generator=gen).tolist() for n in (9, 5, 7)]
    masks = [[int(i >= 2) for i in range(len(s))] for s in seqs]
    batch = collate(seqs, masks, pad_id=0, packed=False)
    expected = 0.0
    for row, seq in enumerate(seqs):
        for t in range(2, len(seq)):  # token t is predicted by the logits at t-1
            expected -= torch.log_softmax(logits[row, t - 1], -1)[seq[t]].item()
    assert nll_sum(token_logprobs(logits, batch), batch.loss_mask).item() == pytest.approx(expected, rel=1e-5)


def test_pretrain_mode_trains_every_token_and_sft_only_the_response(tiny_tokenizer_path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_path)
    ids, mask = pretrain_text("plain text 12", tokenizer)
    assert all(mask) and ids[-1] == tokenizer.eos_token_id
    data = SupervisedDataSection()  # the OpenRLHF default template "User: {}\nAssistant: "
    ids, mask = prompt_response("hi", "there", data, tokenizer)
    assert tokenizer.decode(ids) == "User: hi\nAssistant: there</s>"
    assert tokenizer.decode([t for t, m in zip(ids, mask) if m]) == "there</s>"


def _expected_one_step(model_path: Path, data: Path, lr: float, eps: float) -> dict[str, torch.Tensor]:
    """AdamW's first step on the full-batch token-mean NLL: w − lr·g/(|g|+eps) (bias corrections cancel)."""
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation="eager")
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    pairs = [prompt_response(r["input"], r["output"], SupervisedDataSection(), tokenizer) for r in rows]
    batch = collate([p[0] for p in pairs], [p[1] for p in pairs], tokenizer.pad_token_id, packed=False)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    (nll_sum(token_logprobs(logits, batch), batch.loss_mask) / batch.loss_mask.sum()).backward()
    return {name: (p - lr * p.grad / (p.grad.abs() + eps)).detach() for name, p in model.named_parameters()}


@pytest.mark.slow
@pytest.mark.parametrize(
    "launcher,micro,stage",
    [("single", 8, 2), ("single", 2, 3), ("torchrun", 2, 2)],
    ids=["1rank-1micro-zero2", "1rank-4micro-zero3", "2ranks-2micro-zero2"],
)
def test_one_step_is_the_full_batch_token_mean(tmp_path, tiny_causal_lm_path, launcher, micro, stage) -> None:
    """However the 8 samples are split over micro-batches and ranks, the update is the one of a
    single token mean over all their response tokens (checked through AdamW with a large eps,
    whose first step is then nearly linear in the gradient). One rank trains in this process."""
    data = write_rows(tmp_path / "sft.jsonl", 8)
    lr, eps = 1e3, 1e3
    out = tmp_path / "out"
    command = () if launcher == "single" else ("torch.distributed.run", "--standalone", "--nproc_per_node", "2")
    run = run_in_process if launcher == "single" else lambda *argv: run_rlhf(*argv, launcher=command)
    assert_ok(run("train", "sft", "--model.model_name_or_path", str(tiny_causal_lm_path),
               "--data.dataset", str(data), "--train.batch_size", "8", "--train.micro_batch_size", str(micro),
               "--train.max_epochs", "1", "--train.lr_warmup_ratio", "0", "--train.max_norm", "0",
               "--adam.lr", str(lr), "--adam.eps", str(eps), "--ds.param_dtype", "fp32", "--ds.zero_stage", str(stage),
               "--ds.attn_implementation", "eager", "--ckpt.output_dir", str(out)))
    trained = load_file(out / "model.safetensors")
    expected = _expected_one_step(tiny_causal_lm_path, data, lr, eps)
    moved = 0.0
    for name, tensor in expected.items():
        torch.testing.assert_close(trained[name], tensor, rtol=0, atol=2e-5, msg=name)
        moved = max(moved, (tensor - load_file(tiny_causal_lm_path / "model.safetensors")[name]).abs().max().item())
    assert moved > 1e-3  # the step did move the weights, so the comparison means something
    logged = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert logged["step"] == 1 and logged["timing/step"] > 0 and logged["throughput/tokens_per_s"] > 0


@pytest.mark.slow
def test_lora_sft_saves_an_adapter_that_merges_exactly(tmp_path, tiny_causal_lm_path) -> None:
    """A LoRA run (in this process) saves only its adapter, which learned; `rlhf lora merge` folds it into the base
    model exactly: the merged model's logits are the adapted model's."""
    from peft import PeftModel

    data = write_rows(tmp_path / "sft.jsonl", 32)
    out, merged = tmp_path / "adapter", tmp_path / "merged"
    assert_ok(run_in_process("train", "sft", "--model.model_name_or_path", str(tiny_causal_lm_path),
               "--data.dataset", str(data), "--data.apply_chat_template", "--train.batch_size", "8",
               "--train.micro_batch_size", "4", "--adam.lr", "1e-2", "--ds.param_dtype", "fp32", "--ds.zero_stage", "2",
               "--ds.lora.rank", "8", "--ds.lora.alpha", "16", "--train.gradient_checkpointing_enable",
               "--ds.packing_samples", "--ckpt.output_dir", str(out)))
    assert (out / "adapter_config.json").exists() and (out / "adapter_model.safetensors").exists()
    assert not (out / "model.safetensors").exists()  # adapters only
    losses = [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines() if "loss" in line]
    assert losses[-1] < losses[0]
    assert_ok(run_in_process("lora", "merge", "--model_path", str(tiny_causal_lm_path),
               "--lora_path", str(out), "--output_path", str(merged), "--ds.param_dtype", "fp32"))
    ids = torch.tensor([[1, 40, 41, 42, 43, 44, 45]])
    base = AutoModelForCausalLM.from_pretrained(tiny_causal_lm_path, dtype=torch.float32)
    with torch.no_grad():
        base_logits = base(ids).logits
        adapted = PeftModel.from_pretrained(base, out).eval()(ids).logits
        merged_logits = AutoModelForCausalLM.from_pretrained(merged, dtype=torch.float32)(ids).logits
    torch.testing.assert_close(merged_logits, adapted, rtol=1e-5, atol=1e-5)
    assert (adapted - base_logits).abs().max() > 1e-3  # the adapter learned something


@pytest.mark.slow
def test_missing_output_key_names_file_row_and_flag(tmp_path, tiny_causal_lm_path) -> None:
    data = tmp_path / "bad.jsonl"
    data.write_text(json.dumps({"input": "a", "output": "b"}) + "\n" + json.dumps({"input": "c", "answer": "d"}) + "\n")
    result = run_in_process("train", "sft", "--model.model_name_or_path", str(tiny_causal_lm_path),
                        "--data.dataset", str(data), "--ckpt.output_dir", str(tmp_path / "o"), "--ds.param_dtype", "fp32")
    assert result.returncode == 2
    assert f"{data} row 1 has no key 'output'" in result.stderr and "--data.output_key" in result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-only error")
def test_4bit_on_cpu_is_a_clear_error_before_anything_loads(capsys) -> None:
    result = refused_in_process(capsys, "sft", "--model.model_name_or_path", "unused",
                                "--data.dataset", "unused.jsonl", "--ds.load_in_4bit", "--ds.lora.rank", "8")
    assert_user_error(result, "--ds.load_in_4bit needs a CUDA GPU")


@pytest.mark.slow
def test_moe_balancing_loss_is_added_and_logged(tmp_path, tiny_tokenizer_path) -> None:
    from transformers import MixtralConfig, MixtralForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_path)
    moe = tmp_path / "tiny-moe"
    config = MixtralConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, num_local_experts=4, num_experts_per_tok=2,
                           max_position_embeddings=256, pad_token_id=tokenizer.pad_token_id,
                           eos_token_id=tokenizer.eos_token_id, bos_token_id=tokenizer.bos_token_id)
    torch.manual_seed(0)
    MixtralForCausalLM(config).save_pretrained(moe)
    tokenizer.save_pretrained(moe)
    out = tmp_path / "out"
    assert_ok(run_in_process("train", "sft", "--model.model_name_or_path", str(moe),
               "--data.dataset", str(write_rows(tmp_path / "sft.jsonl", 16)), "--train.batch_size", "8",
               "--train.micro_batch_size", "4", "--ds.param_dtype", "fp32", "--model.aux_loss_coef", "0.01",
               "--ckpt.output_dir", str(out)))
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    # Switch-style balancing loss: num_experts · Σ f_i·P_i, which is 2 (= top-k) when routing is uniform
    assert all(0.5 < m["aux_loss"] < 8.0 for m in metrics)
