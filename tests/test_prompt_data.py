"""Prompt datasets through `datasets`: formats, templates, mixing, errors, and the resumable schedule."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlhf.config.base import ConfigError
from rlhf.config.ppo import DataSection
from rlhf.data.prompts import PromptSchedule, build_prompts, load_prompt_rows
from rlhf.errors import DataError


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def tokenizer(tiny_tokenizer_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_tokenizer_path)


def test_jsonl_with_chat_template_and_labels(tmp_path: Path, tokenizer) -> None:
    file = write_jsonl(tmp_path / "p.jsonl", [{"question": "1+2=", "answer": 3}, {"question": "4+5=", "answer": 9}])
    data = DataSection(prompt_dataset=str(file), input_key="question", label_key="answer", apply_chat_template=True)
    prompts = build_prompts(load_prompt_rows(data, seed=0), data, tokenizer, str(file))
    assert [p["prompt"] for p in prompts] == ["<|user|>1+2=</s><|assistant|>", "<|user|>4+5=</s><|assistant|>"]
    assert [p["label"] for p in prompts] == [3, 9]
    assert tokenizer.decode(prompts[0]["prompt_ids"]) == prompts[0]["prompt"]


def test_parquet_saved_dir_template_and_max_samples(tmp_path: Path, tokenizer) -> None:
    import datasets

    datasets.Dataset.from_list([{"input": f"q{i}"} for i in range(5)]).to_parquet(str(tmp_path / "p.parquet"))
    datasets.Dataset.from_list([{"input": f"d{i}"} for i in range(5)]).save_to_disk(str(tmp_path / "saved"))
    for source in (tmp_path / "p.parquet", tmp_path / "saved"):
        data = DataSection(prompt_dataset=str(source), input_template="Q: {} A:", max_samples=3)
        prompts = build_prompts(load_prompt_rows(data, seed=0), data, tokenizer, str(source))
        assert len(prompts) == 3 and prompts[0]["prompt"].startswith("Q: ") and prompts[0]["label"] is None


def test_mixing_follows_prompt_probs(tmp_path: Path) -> None:
    a = write_jsonl(tmp_path / "a.jsonl", [{"input": f"a{i}"} for i in range(400)])
    b = write_jsonl(tmp_path / "b.jsonl", [{"input": f"b{i}"} for i in range(400)])
    rows = load_prompt_rows(DataSection(prompt_dataset=f"{a},{b}", prompt_probs="0.8,0.2", max_samples=200), seed=0)
    share_a = sum(r["input"].startswith("a") for r in rows) / len(rows)
    assert 0.7 < share_a < 0.9
    for probs, message in (("1", r"has 1 value\(s\) for 2 dataset\(s\) in --data.prompt_dataset"),
                           ("a,b", "every value must be a number"), ("0,0", "sums to 0; probabilities must sum to 1"),
                           ("0.3,0.3", "sums to 0.6"), ("1.5,-0.5", "must be finite and >= 0"), ("nan,1", "finite")):
        with pytest.raises(ConfigError, match=rf"--data.prompt_probs .*{message}"):
            load_prompt_rows(DataSection(prompt_dataset=f"{a},{b}", prompt_probs=probs), seed=0)


def test_errors_name_the_file_row_and_flag(tmp_path: Path, tokenizer) -> None:
    file = write_jsonl(tmp_path / "p.jsonl", [{"input": "x"}, {"prompt": "y"}])
    data = DataSection(prompt_dataset=str(file))
    with pytest.raises(DataError, match=rf"{file} row 1 has no key 'input' \(keys: prompt\); set --data.input_key"):
        build_prompts(load_prompt_rows(data, seed=0), data, tokenizer, str(file))
    with pytest.raises(ConfigError, match="--data.prompt_dataset is required"):
        load_prompt_rows(DataSection(), seed=0)
    (tmp_path / "p.csv").write_text("input\nx\n")
    with pytest.raises(DataError, match="unsupported file type '.csv'"):
        load_prompt_rows(DataSection(prompt_dataset=str(tmp_path / "p.csv")), seed=0)


@pytest.mark.parametrize(("name", "text", "message"), [
    ("missing.jsonl", None, "--data.prompt_dataset {path}: no such file"),
    ("empty.jsonl", "", "--data.prompt_dataset {path}: the file is empty"),
    ("blank.jsonl", "\n\n  \n", "the file has no rows"),
    ("broken.jsonl", '{"input": "a"}\n\n{"input": "b",\n', "{path} line 3: not valid JSON"),
    ("scalar.jsonl", '{"input": "a"}\n7\n', "{path} line 2: expected a JSON object per line, got int"),
    ("broken.json", '[{"input": "a"},\n {"input": }]', "{path} line 2: not valid JSON"),
])
def test_unreadable_files_name_the_file_and_line(tmp_path: Path, name: str, text: str | None, message: str) -> None:
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(DataError, match=message.format(path=path).replace("(", r"\(")):
        load_prompt_rows(DataSection(prompt_dataset=str(path)), seed=0)


def test_prompts_must_be_text_or_chat_messages(tmp_path: Path, tokenizer) -> None:
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    file = write_jsonl(tmp_path / "p.jsonl", [{"input": "x"}, {"input": chat}])
    data = DataSection(prompt_dataset=str(file), apply_chat_template=True)
    assert len(build_prompts(load_prompt_rows(data, seed=0), data, tokenizer, str(file))) == 2
    for bad, kind in ((5, "an int"), (["x", "y"], "a list"), ({"text": "x"}, "a dict"), ([{"role": "user"}], "a list")):
        rows = [{"input": "fine"}, {"input": bad}]
        with pytest.raises(DataError, match=f"src row 1: the value of 'input' \\(--data.input_key\\) is {kind}"):
            build_prompts(rows, data, tokenizer, "src")


def test_empty_and_overlong_prompts_are_filtered_with_a_count_or_refused(tokenizer, caplog) -> None:
    long_text = " ".join(["word"] * 200)
    rows = [{"input": "ok one"}, {"input": "  "}, {"input": long_text}, {"input": "ok two"},
            {"input": [{"role": "user", "content": ""}]}]
    data = DataSection(max_len=64)
    with caplog.at_level("WARNING", logger="rlhf.data"):
        prompts = build_prompts(rows, data, tokenizer, "src.jsonl")
    assert [p["prompt"] for p in prompts] == ["ok one", "ok two"]
    assert all(len(p["prompt_ids"]) < 64 for p in prompts)
    warning = " ".join(r.getMessage() for r in caplog.records)
    assert "dropped 3 of 5 prompts" in warning and "2 empty (rows 1, 4)" in warning
    assert "1 with at least --data.max_len 64 tokens (row 2)" in warning
    with pytest.raises(DataError, match=r"src.jsonl: invalid prompts: 2 empty \(rows 1, 4\)"):
        build_prompts(rows, data.model_copy(update={"on_invalid_prompt": "error"}), tokenizer, "src.jsonl")
    with pytest.raises(DataError, match="no usable prompt is left"):
        build_prompts([{"input": ""}], data, tokenizer, "src.jsonl")


def test_schedule_is_a_seeded_shuffle_per_episode_and_restores() -> None:
    prompts = [{"prompt": str(i)} for i in range(10)]
    straight = PromptSchedule(prompts, batch_size=3, num_episodes=2, seed=5)
    batches = []
    while (batch := straight.next_batch()) is not None:
        batches.append([p["prompt"] for p in batch])
    assert len(batches) == straight.total_batches == 6
    assert sorted(sum(batches[:3], [])) != sorted(sum(batches[3:], [])) or batches[:3] != batches[3:]
    resumed = PromptSchedule(prompts, batch_size=3, num_episodes=2, seed=5)
    for _ in range(4):
        resumed.next_batch()
    state = resumed.state()
    again = PromptSchedule(prompts, batch_size=3, num_episodes=2, seed=5)
    again.restore(state)
    assert [p["prompt"] for p in again.next_batch()] == batches[4]


def test_prompts_carry_their_source_and_steered_weights_draw_by_source_and_restore(tmp_path: Path, tokenizer) -> None:
    easy = write_jsonl(tmp_path / "easy.jsonl", [{"input": f"e{i}"} for i in range(20)])
    hard = write_jsonl(tmp_path / "hard.jsonl", [{"input": f"h{i}"} for i in range(20)])
    data = DataSection(prompt_dataset=f"{easy},{hard}", prompt_probs="0.5,0.5", max_samples=24)
    prompts = build_prompts(load_prompt_rows(data, seed=0), data, tokenizer, "mix")
    assert {p["prompt"][0] for p in prompts if p["prompt_source"] == 0} == {"e"}
    assert {p["prompt"][0] for p in prompts if p["prompt_source"] == 1} == {"h"}

    def hard_share(batch: list[dict]) -> float:
        return sum(p["prompt_source"] for p in batch) / len(batch)

    schedule = PromptSchedule(prompts, batch_size=8, num_episodes=4, seed=3)
    schedule.next_batch()
    schedule.set_weights((0.0, 1.0))
    assert hard_share(schedule.next_batch()) == 1.0
    assert len({p["prompt"] for p in schedule.take(5)}) == 5 and schedule.state()["weights"] == [0.0, 1.0]
    schedule.set_weights((0.9, 0.1))
    state = schedule.state()
    drawn = [schedule.next_batch() for _ in range(6)]
    assert sum(hard_share(b) for b in drawn) / len(drawn) < 0.4  # mostly easy now
    assert all(len({p["prompt"] for p in b}) == len(b) for b in drawn)  # no repeat within a draw
    resumed = PromptSchedule(prompts, batch_size=8, num_episodes=4, seed=3)
    resumed.restore(state)
    assert [[p["prompt"] for p in resumed.next_batch()] for _ in range(6)] == [[p["prompt"] for p in b] for b in drawn]
    assert drawn[-1][-1]["data_state"]["weights"] == [0.9, 0.1]  # what async mode checkpoints
    assert resumed.total_batches == schedule.total_batches == 4 * (len(prompts) // 8)


def test_hub_names_with_dots_go_to_the_hub_and_paths_are_local(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match="OpenRLHF/prompt-collection-v0.1: not a local file and the hub dataset could not be"):
        load_prompt_rows(DataSection(prompt_dataset="OpenRLHF/prompt-collection-v0.1"), seed=0)
    monkeypatch.setenv("HOME", str(tmp_path))
    write_jsonl(tmp_path / "p.jsonl", [{"input": "x"}])
    assert load_prompt_rows(DataSection(prompt_dataset="~/p.jsonl"), seed=0) == [{"input": "x"}]
    with pytest.raises(DataError, match="./missing/p: no such file or dataset dir"):
        load_prompt_rows(DataSection(prompt_dataset="./missing/p"), seed=0)
