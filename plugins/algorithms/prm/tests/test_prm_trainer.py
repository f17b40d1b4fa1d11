"""The PRM trainer: token checks, label alignment (padded and packed), compute(), and real CLI runs.

The tiny test tokenizer splits the default placeholder ``ки`` into bytes, so these tests use its
special token ``<|user|>`` as the step placeholder and ``+``/``-`` as the reward tokens.
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest
import torch
from rlhf_plugin_prm.losses import IGNORE, SOFT, prm_loss
from rlhf_plugin_prm.trainer import PRMConfig, PRMTrainer

from rlhf.config.base import ConfigError
from rlhf.testing.cli import run_in_process

STEP = "<|user|>"
WORDS = "the a an answer question what is plus minus times number think step result".split()


def rows(n: int, seed: int = 0, soft: bool = False) -> list[dict]:
    """Each step ends with ' yes'/' no' then the placeholder; its label is '+' after yes, '-' after no."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        steps, labels = [], []
        for _ in range(rng.randint(2, 4)):
            good = rng.random() < 0.5
            steps.append(" ".join(rng.choice(WORDS) for _ in range(3)) + (" yes " if good else " no ") + STEP)
            labels.append((0.9 if good else 0.2) if soft else ("+" if good else "-"))
        out.append({"input": " ".join(steps), "label": labels})
    return out


def make_trainer(tmp_path, model_path, packed=False, **model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = {"placeholder_token": STEP, "reward_tokens": ["+", "-"], **model}
    config = PRMConfig(model={"model_name_or_path": str(model_path), **model}, ds={"packing_samples": packed})
    trainer = PRMTrainer(config, None, tmp_path)
    trainer.tokenizer = AutoTokenizer.from_pretrained(model_path)
    trainer.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    trainer.device = torch.device("cpu")
    return trainer


def test_labels_sit_on_the_placeholders(tmp_path, tiny_causal_lm_path):
    trainer = make_trainer(tmp_path, tiny_causal_lm_path)
    data = rows(3)
    examples = trainer.build_examples(data, "mem")
    step, plus, minus = (trainer.tokenizer.convert_tokens_to_ids(t) for t in (STEP, "+", "-"))
    for example, row in zip(examples, data):
        at = [t for t, tok in enumerate(example["ids"]) if tok == step]
        assert [example["label_ids"][t] for t in at] == [plus if v == "+" else minus for v in row["label"]]
        assert sum(v != IGNORE for v in example["label_ids"]) == len(row["label"])
    for packed in (False, True):
        trainer.config.ds.packing_samples = packed
        batch = trainer.collate(examples)
        labels = batch.extras["label_ids"]
        assert labels.shape == batch.input_ids.shape
        assert torch.equal(labels != IGNORE, batch.input_ids == step)
        assert trainer.units(batch) == sum(len(r["label"]) for r in data)


@pytest.mark.parametrize("data", [{"apply_chat_template": True}, {"input_template": "Q: {}\nA:"}, {}])
def test_text_rendering_keeps_the_placeholders(tmp_path, tiny_causal_lm_path, data):
    trainer = make_trainer(tmp_path, tiny_causal_lm_path, placeholder_token="<|system|>")
    trainer.config.data = trainer.config.data.model_copy(update=data)
    text = "a yes <|system|> b no <|system|>"
    (example,) = trainer.build_examples([{"input": text, "label": ["+", "-"]}], "mem")
    rendered = trainer.tokenizer.decode(example["ids"])
    expected = {"apply_chat_template": f"<|user|>{text}</s>", "input_template": f"Q: {text}\nA:"}
    assert rendered == expected.get(next(iter(data), ""), text)
    assert sum(v != IGNORE for v in example["label_ids"]) == 2


def test_compute_matches_the_loss_at_placeholder_logits(tmp_path, tiny_causal_lm_path):
    trainer = make_trainer(tmp_path, tiny_causal_lm_path)
    examples = trainer.build_examples(rows(4, seed=1), "mem")
    parts = trainer.compute(trainer.collate(examples), training=True)
    step = trainer.tokenizer.convert_tokens_to_ids(STEP)
    total, correct = 0.0, 0.0
    with torch.no_grad():
        for e in examples:
            logits = trainer.model(input_ids=torch.tensor([e["ids"]])).logits[0]  # no shift: the placeholder's own
            at = torch.tensor(e["ids"]) == step
            losses, hits = prm_loss(logits[at], torch.tensor(e["label_ids"])[at], torch.zeros(int(at.sum())),
                                    trainer.reward_ids)
            total, correct = total + float(losses.sum()), correct + float(hits.sum())
    assert float(parts.loss_sum.detach()) == pytest.approx(total, rel=1e-4)
    assert float(parts.metrics["acc"]) == correct
    parts.loss_sum.backward()
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in trainer.model.parameters())


@pytest.mark.parametrize("soft", [False, True])
def test_packed_batch_gives_the_padded_loss(tmp_path, tiny_causal_lm_path, soft):
    padded = make_trainer(tmp_path, tiny_causal_lm_path)
    packed = make_trainer(tmp_path, tiny_causal_lm_path, packed=True)
    examples = padded.build_examples(rows(5, seed=2, soft=soft), "mem")
    if soft:
        assert all(v in (IGNORE, SOFT) for e in examples for v in e["label_ids"])
    with torch.no_grad():  # as in evaluation
        a = padded.compute(padded.collate(examples), training=False)
        b = packed.compute(packed.collate(examples), training=False)
    assert float(a.loss_sum) == pytest.approx(float(b.loss_sum), rel=1e-4)
    assert float(a.metrics["acc"]) == float(b.metrics["acc"])


def test_full_vocabulary_hard_labels(tmp_path, tiny_causal_lm_path):
    trainer = make_trainer(tmp_path, tiny_causal_lm_path, reward_tokens=None)
    examples = trainer.build_examples(rows(2), "mem")
    assert trainer.reward_ids is None
    parts = trainer.compute(trainer.collate(examples), training=False)
    assert float(parts.loss_sum.detach()) / trainer.units(trainer.collate(examples)) > 1.0  # ~log(vocab), random model


@pytest.mark.parametrize(("model", "label", "match"), [
    ({"placeholder_token": "ки"}, None, "--model.placeholder_token 'ки' is 4 tokens"),
    ({"reward_tokens": ["+", "yes no"]}, None, "--model.reward_tokens 'yes no'"),
    ({"reward_tokens": ["+", "+"]}, None, "repeated"),
    ({}, ["+", "maybe so"], "mem row 1: label 'maybe so'"),
    ({}, ["+", "a"], r"mem row 1: label 'a' is not one of --model.reward_tokens"),
    ({"reward_tokens": None}, [0.5, 1.0], "mem row 1: soft label 0.5 needs exactly two --model.reward_tokens"),
    ({}, [0.5, 1.5], "not a probability"),
    ({}, ["+"], r"mem row 1: 2 placeholder tokens .*--model.placeholder_token.* but 1 labels"),
    ({}, ["+", "-", "+"], "mem row 1: 2 placeholder tokens"),
])
def test_bad_configuration_or_rows(tmp_path, tiny_causal_lm_path, model, label, match):
    trainer = make_trainer(tmp_path, tiny_causal_lm_path, **model)
    data = [{"input": f"a yes {STEP}", "label": ["+"]}, {"input": f"a yes {STEP} b no {STEP}", "label": ["+", "-"]}]
    if label is not None:
        data[1]["label"] = label
    with pytest.raises(ConfigError, match=match):
        trainer.build_examples(data, "mem")


def write_jsonl(path: Path, items: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in items))
    return path


def rlhf(*args: str) -> subprocess.CompletedProcess:
    """``rlhf train prm ARGS`` (one rank) in this process, which the test has moved into its tmp_path."""
    return run_in_process("train", "prm", *args)


def base_flags(model: Path, data: Path, tmp_path: Path) -> list[str]:
    return ["--model.model_name_or_path", str(model), "--data.dataset", str(data), "--train.batch_size", "8",
            "--train.micro_batch_size", "4", "--ds.param_dtype", "fp32", "--ckpt.output_dir", str(tmp_path / "out"),
            "--ckpt.path", str(tmp_path / "ckpt"), "--model.placeholder_token", STEP, "--model.reward_tokens", "+", "-"]


@pytest.mark.slow
def test_cli_label_count_mismatch_exits_2_naming_the_row(tmp_path, tiny_causal_lm_path, monkeypatch):
    """A row with fewer labels than placeholders stops the run: exit 2, the file, the row and the label key named."""
    monkeypatch.chdir(tmp_path)
    data = rows(8)
    data[6]["label"] = data[6]["label"][:-1]
    path = write_jsonl(tmp_path / "bad.jsonl", data)
    result = rlhf(*base_flags(tiny_causal_lm_path, path, tmp_path))
    assert result.returncode == 2, result.stderr[-3000:]
    assert "bad.jsonl row 6:" in result.stderr and "labels (--data.label_key 'label')" in result.stderr


def placeholder_accuracy(model_path, data: list[dict]) -> float:
    """Share of placeholders where the model prefers the labelled reward token of ``+``/``-``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    step, plus, minus = (tokenizer.convert_tokens_to_ids(t) for t in (STEP, "+", "-"))
    hits = total = 0
    with torch.no_grad():
        for row in data:
            ids = torch.tensor([tokenizer(row["input"])["input_ids"]])
            logits = model(input_ids=ids).logits[0][ids[0] == step]
            predicted = ["+" if v else "-" for v in (logits[:, plus] > logits[:, minus]).tolist()]
            hits += sum(p == label for p, label in zip(predicted, row["label"]))
            total += len(row["label"])
    return hits / total


@pytest.mark.slow
def test_cli_training_zero2_packed_learns_the_step_labels(tmp_path, tiny_causal_lm_path, monkeypatch):
    """16 packed ZeRO-2 steps: the loss falls by 40 %, eval accuracy reaches 0.9, and the saved model prefers the
    labelled reward token at held-out placeholders (0.9, and 0.2 better than the start), as the eval reported."""
    monkeypatch.chdir(tmp_path)
    train, held_out = rows(32), rows(16, seed=99)
    data = write_jsonl(tmp_path / "prm.jsonl", train)
    write_jsonl(tmp_path / "eval.jsonl", held_out)
    result = rlhf(*base_flags(tiny_causal_lm_path, data, tmp_path), "--eval.dataset", str(tmp_path / "eval.jsonl"),
                  "--train.max_epochs", "4", "--ds.zero_stage", "2", "--ds.packing_samples", "--adam.lr", "1e-3")
    assert result.returncode == 0, result.stderr[-5000:]
    out = tmp_path / "out"
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in records if "loss" in r]
    final = next(r for r in records if "eval/loss" in r)
    assert len(steps) == 16
    first, last = sum(r["loss"] for r in steps[:2]) / 2, sum(r["loss"] for r in steps[-4:]) / 4
    assert last < first * 0.6, [r["loss"] for r in steps]
    assert final["eval/acc"] >= 0.9 and final["eval/loss"] < 0.3
    before, after = placeholder_accuracy(tiny_causal_lm_path, held_out), placeholder_accuracy(out, held_out)
    assert after >= 0.9 and after > before + 0.2, (before, after)
    assert after == pytest.approx(final["eval/acc"])
