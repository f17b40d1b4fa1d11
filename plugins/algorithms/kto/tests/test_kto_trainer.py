"""The KTO trainer: examples, the mismatched batch, compute() on a plain HF model, and real CLI runs."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest
import torch
from rlhf_plugin_kto.losses import kto_loss
from rlhf_plugin_kto.trainer import KTOConfig, KTOTrainer
from rlhf_supervised.batch import per_sample_sum, token_logprobs

from rlhf.errors import UserError
from rlhf.testing.cli import run_in_process

WORDS = "the a an answer question what is plus minus times number think step result".split()


def rows(n: int, seed: int = 0) -> list[dict]:
    """Random prompts; even rows are desirable with completion 'yes', odd rows undesirable with 'no'."""
    rng = random.Random(seed)
    return [{"input": " ".join(rng.choice(WORDS) for _ in range(4)), "output": "yes" if i % 2 == 0 else "no",
             "label": i % 2 == 0} for i in range(n)]


def make_trainer(tmp_path, model_path, packed=False, **model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = KTOConfig(model={"model_name_or_path": str(model_path), **model}, ds={"packing_samples": packed})
    trainer = KTOTrainer(config, None, tmp_path)
    trainer.tokenizer = AutoTokenizer.from_pretrained(model_path)
    torch.manual_seed(0)
    trainer.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    trainer.frozen = {"ref": AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)}
    with torch.no_grad():  # make the policy differ from the reference
        for p in trainer.model.parameters():
            p.add_(torch.randn_like(p) * 0.02)
    trainer.device = torch.device("cpu")
    return trainer


def test_examples_and_mismatched_batch(tmp_path, tiny_causal_lm_path):
    trainer = make_trainer(tmp_path, tiny_causal_lm_path)
    examples = trainer.build_examples(rows(3), "mem")
    assert [e["desirable"] for e in examples] == [True, False, True]
    eos = trainer.tokenizer.eos_token_id
    assert all(e["response"][-1] == eos and e["length"] == len(e["prompt"]) + len(e["response"]) for e in examples)
    batch = trainer.collate(examples)
    assert batch.num_samples == 6 and batch.extras["matched"] == 3 and trainer.units(batch) == 3.0
    assert batch.extras["desirable"].tolist() == [True, False, True]
    for i, e in enumerate(examples):
        for row, (prompt, response) in ((i, (e["prompt"], e["response"])),
                                        (3 + i, (e["prompt"], examples[(i + 1) % 3]["response"]))):
            n = len(prompt) + len(response)
            assert batch.input_ids[row, :n].tolist() == prompt + response
            assert batch.loss_mask[row, :n].tolist() == [0.0] * len(prompt) + [1.0] * len(response)
    single = trainer.collate(examples[:1])
    assert torch.equal(single.input_ids[0], single.input_ids[1])


def test_mismatched_sequences_are_cut_to_max_len(tmp_path, tiny_causal_lm_path):
    trainer = make_trainer(tmp_path, tiny_causal_lm_path)
    examples = trainer.build_examples([{"input": "a", "output": "the answer is " * 8, "label": 1},
                                       {"input": "what is the question " * 3, "output": "no", "label": 0}], "mem")
    trainer.config.data.max_len = max(e["length"] for e in examples)
    batch = trainer.collate(examples)
    assert batch.input_ids.shape[1] == trainer.config.data.max_len


def test_compute_matches_independent_calculation(tmp_path, tiny_causal_lm_path):
    trainer = make_trainer(tmp_path, tiny_causal_lm_path, beta=0.5, desirable_loss_weight=1.5)
    examples = trainer.build_examples(rows(4), "mem")
    batch = trainer.collate(examples)
    parts = trainer.compute(batch, training=True)

    def logps(model, prompt, response):
        ids = torch.tensor([prompt + response])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
        picked = logp.gather(-1, ids[0, 1:, None]).squeeze(-1)
        return float(picked[len(prompt) - 1 :].sum())

    pol = [logps(trainer.model, e["prompt"], e["response"]) for e in examples]
    ref = [logps(trainer.frozen["ref"], e["prompt"], e["response"]) for e in examples]
    mism = [(e["prompt"], examples[(i + 1) % 4]["response"]) for i, e in enumerate(examples)]
    kl = sum(logps(trainer.model, *m) - logps(trainer.frozen["ref"], *m) for m in mism) / 4
    want = kto_loss(torch.tensor(pol), torch.tensor(ref), torch.tensor(kl), batch.extras["desirable"], 0.5, 1.5, 1.0)
    assert float(parts.loss_sum.detach()) == pytest.approx(float(want.sum()), rel=1e-4)
    assert float(parts.metrics["kl"]) == pytest.approx(max(kl, 0.0) * 4, rel=1e-4, abs=1e-6)
    assert float(parts.metrics["desirable_frac"]) == 2.0
    assert float(parts.metrics["desirable_reward_total"]) == pytest.approx(0.5 * (pol[0] - ref[0] + pol[2] - ref[2]),
                                                                           rel=1e-4)
    parts.loss_sum.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in trainer.model.parameters())
    assert all(p.grad is None for p in trainer.frozen["ref"].parameters())


def test_packed_batch_gives_the_padded_loss(tmp_path, tiny_causal_lm_path):
    padded = make_trainer(tmp_path, tiny_causal_lm_path, beta=0.3)
    packed = make_trainer(tmp_path, tiny_causal_lm_path, packed=True, beta=0.3)
    examples = padded.build_examples(rows(5, seed=3), "mem")
    with torch.no_grad():  # as in evaluation
        a = padded.compute(padded.collate(examples), training=False)
        b = packed.compute(packed.collate(examples), training=False)
    assert packed.collate(examples).input_ids.shape[0] == 1
    assert float(a.loss_sum) == pytest.approx(float(b.loss_sum), rel=1e-4)
    assert float(a.metrics["kl"]) == pytest.approx(float(b.metrics["kl"]), rel=1e-3, abs=1e-5)
    # the per-sample reads agree too
    pa, pb = padded.collate(examples), packed.collate(examples)
    with torch.no_grad():
        la = per_sample_sum(token_logprobs(padded.model(**pa.model_inputs()).logits, pa), pa)
        lb = per_sample_sum(token_logprobs(packed.model(**pb.model_inputs()).logits, pb), pb)
    assert torch.allclose(la, lb, atol=1e-3)


@pytest.mark.parametrize("label", ["yes", 2, None])
def test_bad_label_is_a_user_error_naming_the_row(tmp_path, tiny_causal_lm_path, label):
    trainer = make_trainer(tmp_path, tiny_causal_lm_path)
    data = rows(3)
    data[1]["label"] = label
    with pytest.raises(UserError, match="mem row 1"):  # a wrong value (ConfigError) or a missing key (DataError)
        trainer.build_examples(data, "mem")


def write_jsonl(path: Path, items: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in items))
    return path


def rlhf(*args: str) -> subprocess.CompletedProcess:
    """``rlhf train kto ARGS`` (one rank) in this process, which the test has moved into its tmp_path."""
    return run_in_process("train", "kto", *args)


@pytest.mark.slow
def test_cli_bad_row_exits_2_naming_the_row(tmp_path, tiny_causal_lm_path, monkeypatch):
    """A row without a label stops the run: exit 2, the file, the row and --data.label_key named."""
    monkeypatch.chdir(tmp_path)
    data = rows(8)
    del data[5]["label"]
    path = write_jsonl(tmp_path / "bad.jsonl", data)
    result = rlhf("--model.model_name_or_path", str(tiny_causal_lm_path), "--data.dataset", str(path),
                  "--train.batch_size", "4", "--train.micro_batch_size", "4", "--ds.param_dtype", "fp32", "--ckpt.output_dir", str(tmp_path / "out"),
                  "--ckpt.path", str(tmp_path / "ckpt"))
    assert result.returncode == 2, result.stderr[-3000:]
    assert "bad.jsonl row 5 has no key 'label'" in result.stderr and "--data.label_key" in result.stderr


@pytest.mark.slow
def test_cli_training_zero3_lowers_the_loss(tmp_path, tiny_causal_lm_path, monkeypatch):
    """16 ZeRO-3 steps: the first loss is 1 - σ(0) (policy == reference), the last ones are lower, the eval loss
    falls below 0.45 with desirable rewards above 0 above undesirable ones, and the saved model loads."""
    from transformers import AutoModelForCausalLM

    monkeypatch.chdir(tmp_path)
    data = write_jsonl(tmp_path / "kto.jsonl", rows(32))
    out = tmp_path / "out"
    result = rlhf("--model.model_name_or_path", str(tiny_causal_lm_path), "--data.dataset", str(data),
                  "--eval.dataset", str(data), "--train.batch_size", "8", "--train.micro_batch_size", "4",
                  "--train.max_epochs", "4", "--ds.param_dtype", "fp32", "--ds.zero_stage", "3", "--adam.lr", "1e-3",
                  "--model.beta", "0.1", "--ckpt.output_dir", str(out), "--ckpt.path", str(tmp_path / "ckpt"))
    assert result.returncode == 0, result.stderr[-5000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    final = next(r for r in records if "eval/loss" in r)
    assert len(steps) == 16
    assert steps[0]["loss"] == pytest.approx(0.5)  # policy == reference at the first step: 1 - σ(0)
    last = sum(r["loss"] for r in steps[-4:]) / 4
    assert last < steps[0]["loss"] - 0.05, [r["loss"] for r in steps]
    assert final["eval/loss"] < 0.45
    assert final["eval/desirable_reward"] > 0 > final["eval/undesirable_reward"]
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.vocab_size > 0 and sum(p.numel() for p in model.parameters()) > 0
