"""``rlhf generate`` pieces in-process: flag checks, prompt loading/slicing, scoring, the atomic write."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
from rlhf_plugin_best_of_n.command import GenerateCommand, check_args, write_jsonl_atomic

from rlhf.config.base import ConfigError
from rlhf.errors import DataError


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    GenerateCommand.add_arguments(parser)
    return parser.parse_args(["--model", "m", "--dataset", "d.jsonl", "--output", "o.jsonl", *argv])


def write_prompts(path: Path, count: int, key: str = "input") -> Path:
    path.write_text("".join(json.dumps({key: f"what is {i}+{i}?"}) + "\n" for i in range(count)))
    return path


@pytest.mark.parametrize(("argv", "message"), [
    (["--post_processor", "bogus"], "--post_processor 'bogus' is unknown"),
    (["--post_processor", "rs"], "--post_processor rs needs a reward per response: pass --reward_model PATH"),
    (["--post_processor", "csft"], "--post_processor csft needs a reward per response: pass --reward_model PATH"),
    (["--best_of_n", "0"], "--best_of_n must be >= 1, got 0"),
    (["--post_processor", "iter_dpo", "--reward_model", "rm", "--best_of_n", "1"], "needs --best_of_n >= 2"),
    (["--best_of_n", "4", "--temperature", "0"], "use a temperature > 0"),
    (["--iter", "1"], "--iter and --rollout_batch_size go together"),
    (["--input_template", "no slot"], "--input_template 'no slot' has no {}"),
    (["--input_template", "{} {name}"], "--input_template '{} {name}' does not format"),
    (["--post_processor", "csft", "--reward_model", "rm", "--csft_prompt_template", "{input}"], "--csft_prompt_template"),
])
def test_flag_errors_name_the_flag(argv, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        check_args(parse(*argv))


def test_good_flags_pass():
    check_args(parse("--post_processor", "iter_dpo", "--reward_model", "rm", "--best_of_n", "2", "--iter", "0",
                     "--rollout_batch_size", "8"))


def test_prompt_slices_templates_and_csft_conditioning(tmp_path, tiny_tokenizer_path):
    from rlhf_plugin_best_of_n.sampling import load_prompts
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_path)
    data = str(write_prompts(tmp_path / "p.jsonl", 10))
    prompts = load_prompts(parse("--dataset", data, "--iter", "1", "--rollout_batch_size", "4"), tokenizer, 512)
    assert [p.index for p in prompts] == [4, 5, 6, 7]
    assert prompts[0].value == "what is 4+4?" and prompts[0].text == "User: what is 4+4?\nAssistant: "
    assert prompts[0].ids == tokenizer(prompts[0].text)["input_ids"]
    last = load_prompts(parse("--dataset", data, "--iter", "2", "--rollout_batch_size", "4"), tokenizer, 512)
    assert [p.index for p in last] == [8, 9]  # the last slice may be short
    with pytest.raises(ConfigError, match="--iter 3 --rollout_batch_size 4 starts at row 12"):
        load_prompts(parse("--dataset", data, "--iter", "3", "--rollout_batch_size", "4"), tokenizer, 512)
    chat = load_prompts(parse("--dataset", data, "--apply_chat_template", "--csft_reward", "5"), tokenizer, 512)
    assert chat[0].text == "<|user|>what is 0+0? <rm_score>: 5.00 </s><|assistant|>"
    assert chat[0].scored_text == "<|user|>what is 0+0?</s><|assistant|>"  # the reward model never sees the condition
    assert chat[0].value == "what is 0+0?"


def test_missing_input_key_names_file_row_and_flag(tmp_path, tiny_tokenizer_path):
    from rlhf_plugin_best_of_n.sampling import load_prompts
    from transformers import AutoTokenizer

    data = str(write_prompts(tmp_path / "q.jsonl", 3, key="question"))
    with pytest.raises(DataError, match=r"q.jsonl row 0 has no key 'input' \(keys: question\); set --input_key"):
        load_prompts(parse("--dataset", data), AutoTokenizer.from_pretrained(tiny_tokenizer_path), 512)


def test_reward_scorer_matches_transformers(tiny_reward_model_path):
    import torch
    from rlhf_plugin_best_of_n.scoring import RewardScorer
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    texts = ["User: what is 1+1?\nAssistant: 2", "User: hi\nAssistant: hello world model reward", "x"]
    scorer = RewardScorer(str(tiny_reward_model_path), "fp32", "sdpa", "score", normalize=False, max_len=512)
    rewards = scorer.score(texts, add_special_tokens=True, batch_size=2)
    tokenizer = AutoTokenizer.from_pretrained(tiny_reward_model_path)
    model = AutoModelForSequenceClassification.from_pretrained(tiny_reward_model_path, dtype=torch.float32).eval()
    for text, reward in zip(texts, rewards):
        ids = tokenizer(text)["input_ids"] + [tokenizer.eos_token_id]
        with torch.no_grad():
            assert reward == pytest.approx(float(model(torch.tensor([ids])).logits[0, 0]), abs=1e-5)


def test_reward_scorer_normalizes_with_config_statistics(tmp_path, tiny_reward_model_path):
    import shutil

    from rlhf_plugin_best_of_n.scoring import RewardScorer

    path = tmp_path / "rm"
    shutil.copytree(tiny_reward_model_path, path)
    config = json.loads((path / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "mean": 0.5, "std": 2.0}))
    raw = RewardScorer(str(path), "fp32", "sdpa", "score", normalize=False, max_len=512).score(["a b c"], True, 4)[0]
    scaled = RewardScorer(str(path), "fp32", "sdpa", "score", normalize=True, max_len=512).score(["a b c"], True, 4)[0]
    assert scaled == pytest.approx((raw - 0.5) / 2.0, abs=1e-6)


def test_causal_lm_is_refused_as_reward_model(tiny_causal_lm_path):
    from rlhf_plugin_best_of_n.scoring import check_reward_model

    with pytest.raises(ConfigError, match="has no 'score' value head"):
        check_reward_model(str(tiny_causal_lm_path), "score")


def test_atomic_write_replaces_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "sub" / "out.jsonl"
    write_jsonl_atomic(target, [{"a": 1}, {"b": "é"}])
    write_jsonl_atomic(target, [{"c": [1, 2]}])
    assert [json.loads(line) for line in target.read_text(encoding="utf-8").splitlines()] == [{"c": [1, 2]}]
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.jsonl"]

    class Boom:  # not JSON-serialisable: the write fails half-way
        pass

    with pytest.raises(TypeError):
        write_jsonl_atomic(target, [{"ok": 1}, {"bad": Boom()}])
    assert json.loads(target.read_text()) == {"c": [1, 2]}  # the previous file is intact
    assert sorted(p.name for p in target.parent.iterdir()) == ["out.jsonl"]
