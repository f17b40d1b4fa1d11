"""rlhf train rm: losses vs formulas, the saved model's reward statistics, LoRA reward models."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
from rlhf_plugin_rm.losses import pairwise_loss
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from rlhf.testing.cli import assert_ok, run_in_process


def rlhf(*args: str) -> None:
    """``rlhf ARGS`` (one rank) in this process: the runs here are about what they save, not their process."""
    assert_ok(run_in_process(*args))


def write_pairs(path: Path, count: int, seed: int) -> Path:
    """Chosen responses state the sum, rejected ones refuse: a preference a tiny model learns in a few steps."""
    rng = random.Random(seed)
    with path.open("w") as handle:
        for _ in range(count):
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            handle.write(json.dumps({"prompt": f"what is {a}+{b}?", "chosen": f"the answer is {a + b}",
                                     "rejected": rng.choice(["no", "no no", "what no"]), "margin": rng.random()}) + "\n")
    return path


def test_pairwise_losses_match_their_formulas() -> None:
    gen = torch.Generator().manual_seed(0)
    chosen, rejected, margin = (torch.randn(64, generator=gen) * 3 for _ in range(3))
    expected_sigmoid = [-math.log(1 / (1 + math.exp(-(c - r - m))))
                        for c, r, m in zip(chosen.tolist(), rejected.tolist(), margin.tolist())]
    torch.testing.assert_close(pairwise_loss(chosen, rejected, "sigmoid", margin), torch.tensor(expected_sigmoid),
                               rtol=1e-5, atol=1e-5)
    expected_logexp = [math.log(1 + math.exp(r - c)) for c, r in zip(chosen.tolist(), rejected.tolist())]
    torch.testing.assert_close(pairwise_loss(chosen, rejected, "logexp"), torch.tensor(expected_logexp), rtol=1e-5, atol=1e-5)
    # without a margin the two losses are the same function of r_c − r_r
    torch.testing.assert_close(pairwise_loss(chosen, rejected, "sigmoid"), pairwise_loss(chosen, rejected, "logexp"))
    assert torch.isfinite(pairwise_loss(torch.tensor([1e4, -1e4]), torch.tensor([-1e4, 1e4]), "sigmoid")).all()


def _chat_texts(tokenizer, row) -> list[str]:
    prompt = tokenizer.apply_chat_template([{"role": "user", "content": row["prompt"]}], tokenize=False,
                                           add_generation_prompt=True)
    return [prompt + row["chosen"] + "</s>", prompt + row["rejected"] + "</s>"]


def _rewards(model_dir: Path, rows: list[dict]) -> torch.Tensor:
    """Rewards as a user reads them: AutoModelForSequenceClassification on the chat texts."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for row in rows:
            for text in _chat_texts(tokenizer, row):
                ids = tokenizer(text, add_special_tokens=False, return_tensors="pt")
                out.append(model(**ids).logits[0, 0])
    return torch.stack(out)


@pytest.mark.slow
def test_rm_trains_and_stores_reward_statistics_of_the_eval_set(tmp_path, tiny_causal_lm_path) -> None:
    """A causal LM becomes a reward model (new ``score`` head); the saved config's mean/std are those
    of the rewards it gives the eval pairs, as AutoModelForSequenceClassification computes them."""
    train, evaluation = write_pairs(tmp_path / "train.jsonl", 48, 0), write_pairs(tmp_path / "eval.jsonl", 12, 1)
    out = tmp_path / "rm"
    rlhf("train", "rm", "--model.model_name_or_path", str(tiny_causal_lm_path), "--data.dataset", str(train),
         "--eval.dataset", str(evaluation), "--data.prompt_key", "prompt", "--data.apply_chat_template",
         "--train.batch_size", "8", "--train.micro_batch_size", "4", "--adam.lr", "1e-3", "--ds.param_dtype", "fp32",
         "--ds.zero_stage", "3", "--ds.packing_samples", "--model.margin_loss_enable", "--data.margin_key", "margin",
         "--ckpt.output_dir", str(out))
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m for m in metrics if "eval/acc" in m][-1]["eval/acc"] >= 0.9
    config = json.loads((out / "config.json").read_text())
    rewards = _rewards(out, [json.loads(line) for line in evaluation.read_text().splitlines()])
    assert config["mean"] == pytest.approx(rewards.mean().item(), abs=1e-4)
    assert config["std"] == pytest.approx(rewards.std(unbiased=False).item(), abs=1e-4)
    assert config["value_head_prefix"] == "score"
    assert (rewards[0::2] > rewards[1::2]).float().mean() >= 0.9


@pytest.mark.slow
def test_lora_reward_model_merges_with_is_rm(tmp_path, tiny_reward_model_path) -> None:
    """A LoRA RM run saves only the adapter; ``rlhf lora merge --is_rm`` gives the rewards of base + adapter, which
    differ from the base model's, and keeps the run's reward statistics."""
    from peft import PeftModel

    train = write_pairs(tmp_path / "train.jsonl", 16, 2)
    out, merged = tmp_path / "rm-lora", tmp_path / "rm-merged"
    rlhf("train", "rm", "--model.model_name_or_path", str(tiny_reward_model_path), "--data.dataset", str(train),
         "--data.prompt_key", "prompt", "--data.apply_chat_template", "--train.batch_size", "8",
         "--train.micro_batch_size", "8", "--adam.lr", "1e-2", "--ds.param_dtype", "fp32", "--ds.zero_stage", "2",
         "--ds.lora.rank", "4", "--model.loss_type", "logexp", "--ckpt.output_dir", str(out))
    assert (out / "adapter_model.safetensors").exists() and not (out / "model.safetensors").exists()
    rlhf("lora", "merge", "--model_path", str(tiny_reward_model_path), "--lora_path", str(out), "--output_path",
         str(merged), "--is_rm", "--param_dtype", "fp32")
    ids = torch.tensor([[1, 50, 60, 70, 2]])
    base = AutoModelForSequenceClassification.from_pretrained(tiny_reward_model_path, dtype=torch.float32, num_labels=1)
    with torch.no_grad():
        base_reward = base(ids).logits
        adapted = PeftModel.from_pretrained(base, out).eval()(ids).logits
        merged_model = AutoModelForSequenceClassification.from_pretrained(merged, dtype=torch.float32)
        merged_reward = merged_model(ids).logits
    torch.testing.assert_close(merged_reward, adapted, rtol=1e-5, atol=1e-5)
    assert (adapted - base_reward).abs().max() > 1e-3  # the adapter (and the head) learned something
    assert merged_model.config.mean == pytest.approx(json.loads((out / "config.json").read_text())["mean"])
