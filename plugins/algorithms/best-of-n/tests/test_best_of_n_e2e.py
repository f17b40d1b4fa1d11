"""``rlhf generate`` end to end on the tiny offline models: the HF engine and ``--score_only`` in the test's own
process (they need no process of their own), the vLLM engine and the refused flag in a subprocess."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from rlhf_plugin_best_of_n.post_processors import iterative_dpo

from rlhf.testing.cli import run_in_process, run_rlhf

TEMPLATE = "User: {}\nAssistant: "
PROMPTS = [f"what is {a}+{b}? please compute" for a, b in [(1, 2), (13, 4), (25, 25), (7, 90), (310, 2), (5, 5)]]


def run_generate(tmp_path: Path, *argv: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return run_rlhf("generate", *argv, timeout=timeout,
                    env={"HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(tmp_path / "hf-cache")})


def generate_here(*argv: str) -> subprocess.CompletedProcess:
    """``rlhf generate ARGV`` in this process (HF engine or scoring only: no engine process, no vLLM state left)."""
    return run_in_process("generate", *argv)


def prompt_file(tmp_path: Path) -> str:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"question": p}) + "\n" for p in PROMPTS))
    return str(path)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def transformers_rewards(reward_model_path: Path, prompts: list[str], responses: list[str]) -> list[float]:
    """The reference: the RM's logit on `template(prompt) + response + EOS`, one unpadded sequence at a time."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(reward_model_path)
    model = AutoModelForSequenceClassification.from_pretrained(reward_model_path, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for prompt, response in zip(prompts, responses):
            ids = tokenizer(TEMPLATE.format(prompt) + response)["input_ids"] + [tokenizer.eos_token_id]
            out.append(float(model(torch.tensor([ids])).logits[0, 0]))
    return out


def test_unknown_post_processor_exits_2_naming_the_flag(tmp_path):
    result = run_generate(tmp_path, "--model", "nowhere", "--dataset", "none.jsonl", "--output", str(tmp_path / "o.jsonl"),
                          "--post_processor", "best_one", timeout=120)
    assert result.returncode == 2, result.stderr
    assert "rlhf: error: --post_processor 'best_one' is unknown (known: csft, iter_dpo, none, rs)" in result.stderr
    assert not (tmp_path / "o.jsonl").exists()


@pytest.mark.slow
def test_generate_hf_iter_dpo_end_to_end(tmp_path, tiny_causal_lm_path, tiny_reward_model_path):
    """HF engine, 4 samples a prompt: the iter_dpo pairs keep the raw prompts, carry the rewards transformers gives
    them, and are the best and worst of the scored samples that the same seed gives without a post-processor."""
    common = ["--model", str(tiny_causal_lm_path), "--dataset", prompt_file(tmp_path), "--input_key", "question",
              "--input_template", TEMPLATE, "--best_of_n", "4", "--max_new_tokens", "12", "--engine", "hf",
              "--reward_model", str(tiny_reward_model_path), "--dtype", "fp32", "--micro_batch_size", "4", "--seed", "3"]
    pairs_path, samples_path = tmp_path / "out" / "pairs.jsonl", tmp_path / "out" / "samples.jsonl"
    result = generate_here(*common, "--post_processor", "iter_dpo", "--output", str(pairs_path))
    assert result.returncode == 0, result.stderr
    pairs = read_jsonl(pairs_path)
    assert len(pairs) == len(PROMPTS)
    assert [p["prompt"] for p in pairs] == PROMPTS  # the raw dataset value, for `rlhf train dpo --data.prompt_key prompt`
    for pair in pairs:
        assert set(pair) == {"prompt", "chosen", "rejected", "chosen_reward", "rejected_reward"}
        assert pair["chosen_reward"] >= pair["rejected_reward"]
    reference = transformers_rewards(tiny_reward_model_path, [p["prompt"] for p in pairs] * 2,
                                     [p["chosen"] for p in pairs] + [p["rejected"] for p in pairs])
    assert [p["chosen_reward"] for p in pairs] + [p["rejected_reward"] for p in pairs] == pytest.approx(reference, abs=1e-4)

    # the same seed samples the same responses: the pairs are the best/worst of every scored sample
    result = generate_here(*common, "--output", str(samples_path))
    assert result.returncode == 0, result.stderr
    samples = read_jsonl(samples_path)
    assert len(samples) == 4 * len(PROMPTS)
    assert [s["prompt_index"] for s in samples] == [i for i in range(len(PROMPTS)) for _ in range(4)]
    assert len({s["output"] for s in samples}) > len(PROMPTS)  # sampled, not n copies of one response
    assert iterative_dpo(samples) == pairs


@pytest.mark.slow
def test_generate_hf_csft_on_an_iteration_slice(tmp_path, tiny_causal_lm_path, tiny_reward_model_path):
    """``--iter 1 --rollout_batch_size 4`` samples the rows [4, 8); csft tags each prompt with its reward,
    z-normalised over the whole set."""
    output = tmp_path / "csft.jsonl"
    result = generate_here("--model", str(tiny_causal_lm_path), "--dataset", prompt_file(tmp_path), "--input_key",
                           "question", "--best_of_n", "3", "--max_new_tokens", "8", "--engine", "hf", "--dtype", "fp32",
                           "--iter", "1", "--rollout_batch_size", "4", "--reward_model", str(tiny_reward_model_path),
                           "--post_processor", "csft", "--normalize_reward", "--output", str(output))
    assert result.returncode == 0, result.stderr
    rows = read_jsonl(output)
    assert len(rows) == 2 * 3  # rows [4, 8) of 6 prompts: the last two, 3 samples each
    scores = []
    for i, row in enumerate(rows):
        match = re.fullmatch(r"(.*) <rm_score>: (-?\d+\.\d\d) ", row["input"], flags=re.S)
        assert match and match.group(1) == PROMPTS[4 + i // 3], row
        scores.append(float(match.group(2)))
    assert abs(sum(scores) / len(scores)) < 0.01  # z-normalised over the whole set (up to the 2-decimal rounding)


@pytest.mark.slow
def test_generate_vllm_scores_every_sample(tmp_path, tiny_causal_lm_path, tiny_reward_model_path):
    output = tmp_path / "vllm.jsonl"
    argv = ["--model", str(tiny_causal_lm_path), "--dataset", prompt_file(tmp_path), "--input_key", "question",
            "--input_template", TEMPLATE, "--best_of_n", "4", "--max_new_tokens", "12", "--engine", "vllm",
            "--dtype", "fp32", "--reward_model", str(tiny_reward_model_path), "--output", str(output)]
    result = run_generate(tmp_path, *argv, timeout=600)
    assert result.returncode == 0, result.stderr
    rows = read_jsonl(output)
    assert len(rows) == 4 * len(PROMPTS)
    assert [r["prompt_index"] for r in rows] == [i for i in range(len(PROMPTS)) for _ in range(4)]
    assert all(r["input"] == PROMPTS[r["prompt_index"]] for r in rows)
    assert len({r["output"] for r in rows}) > len(PROMPTS)
    reference = transformers_rewards(tiny_reward_model_path, [r["input"] for r in rows], [r["output"] for r in rows])
    assert [r["reward"] for r in rows] == pytest.approx(reference, abs=1e-4)


@pytest.mark.slow
def test_score_only_scores_a_file_as_openrlhf_batch_inference_rm(tmp_path, tiny_reward_model_path):
    """OpenRLHF's `batch_inference --eval_task rm`, then the iterative-DPO pairs of the scored file."""
    responses = ["3", "no idea", "17", "seventeen", "50", "fifty", "97", "ninety", "312", "3 1 2", "10", "ten"]
    rows = [{"question": PROMPTS[i // 2], "answer": response} for i, response in enumerate(responses)]
    data = tmp_path / "responses.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows))
    scored, pairs = tmp_path / "scored.jsonl", tmp_path / "pairs.jsonl"
    result = generate_here("--score_only", "--model", "unused", "--reward_model", str(tiny_reward_model_path),
                           "--dataset", str(data), "--input_key", "question", "--output_key", "answer",
                           "--input_template", TEMPLATE, "--dtype", "fp32", "--output", str(scored))
    assert result.returncode == 0, result.stderr
    out = read_jsonl(scored)
    assert [(r["input"], r["output"]) for r in out] == [(r["question"], r["answer"]) for r in rows]
    reference = transformers_rewards(tiny_reward_model_path, [r["question"] for r in rows], responses)
    assert [r["reward"] for r in out] == pytest.approx(reference, abs=1e-4)

    # the OpenRLHF <= 0.9 command line: the reward model is --pretrain, the task --eval_task rm
    result = generate_here("--eval_task", "rm", "--pretrain", str(tiny_reward_model_path), "--dataset", str(data),
                           "--input_key", "question", "--output_key", "answer", "--input_template", TEMPLATE,
                           "--output_path", str(pairs), "--post_processor", "iter_dpo", "--dtype", "fp32")
    assert result.returncode == 0, result.stderr
    assert "rlhf generate --score_only --model" in result.stderr  # the deprecation line shows today's command
    assert read_jsonl(pairs) == iterative_dpo(out)
    assert len(read_jsonl(pairs)) == len(PROMPTS)
