"""``--data.dataloader_num_workers``: data preparation in real worker processes, in the order 0 workers give."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from rlhf.data.workers import computed_in_order
from rlhf.errors import DataError


def _pid_and_square(x: int) -> tuple[int, int]:
    if x == 13:
        raise DataError("row 13 is bad")
    return os.getpid(), x * x


def test_results_come_back_in_order_from_other_processes() -> None:
    items = list(range(12))
    inline = list(computed_in_order(_pid_and_square, items, workers=0))
    parallel = list(computed_in_order(_pid_and_square, items, workers=2))
    assert [r[1] for r in parallel] == [r[1] for r in inline] == [x * x for x in items]
    assert {r[0] for r in inline} == {os.getpid()}
    assert os.getpid() not in {r[0] for r in parallel} and len({r[0] for r in parallel}) > 1


def test_a_user_error_in_a_worker_is_raised_unchanged() -> None:
    with pytest.raises(DataError, match=r"^row 13 is bad$"):
        list(computed_in_order(_pid_and_square, list(range(20)), workers=2))


def test_ppo_prompts_are_the_same_with_workers(tiny_tokenizer_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from transformers import AutoTokenizer

    from rlhf.config.ppo import DataSection
    from rlhf.data import prompts as prompt_module

    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_path)
    rng = random.Random(0)
    rows = [{"input": "" if i % 97 == 5 else "word " * rng.randint(1, 30), "label": str(i)} for i in range(700)]
    data = DataSection(max_len=20, label_key="label")
    inline = prompt_module.build_prompts(rows, data, tokenizer, "p.jsonl")
    warning_inline = caplog.text
    caplog.clear()
    parallel = prompt_module.build_prompts(rows, data, tokenizer, "p.jsonl", workers=2)
    assert parallel == inline and 0 < len(inline) < len(rows)
    assert caplog.text == warning_inline and "rows 5, 102" in warning_inline  # the dropped rows, counted and named


@pytest.mark.slow
def test_sft_trains_identically_with_worker_processes(tmp_path: Path, tiny_causal_lm_path: Path, monkeypatch) -> None:
    from rlhf_supervised.trainer import SupervisedTrainer

    from rlhf.cli.main import main
    from rlhf.records.metrics import read_metrics

    data = tmp_path / "sft.jsonl"
    rng = random.Random(0)
    data.write_text("".join(json.dumps({"input": f"what is {a}+{b}?", "output": f"{a + b}"}) + "\n"
                            for a, b in ((rng.randint(1, 99), rng.randint(1, 99)) for _ in range(48))))
    pids = tmp_path / "pids"
    pids.mkdir()
    original = SupervisedTrainer._step_batches

    def recorded(self, step):
        (pids / str(os.getpid())).touch()
        return original(self, step)

    monkeypatch.setattr(SupervisedTrainer, "_step_batches", recorded)
    losses = {}
    for workers in (0, 2):
        out = tmp_path / f"out{workers}"
        assert main(["train", "sft", "--model.model_name_or_path", str(tiny_causal_lm_path), "--data.dataset", str(data),
                     "--train.batch_size", "8", "--train.micro_batch_size", "4", "--train.max_epochs", "2",
                     "--ds.param_dtype", "fp32", "--ds.zero_stage", "2", "--ds.attn_implementation", "eager",
                     "--adam.lr", "1e-3", "--data.dataloader_num_workers", str(workers), "--ckpt.output_dir", str(out)]) == 0
        losses[workers] = [m["loss"] for m in read_metrics(out)]
        if workers == 0:
            assert {p.name for p in pids.iterdir()} == {str(os.getpid())}
    assert len(losses[0]) == 12 and losses[2] == losses[0]  # bit-identical: the same batches in the same order
    assert len({p.name for p in pids.iterdir()} - {str(os.getpid())}) == 2  # both workers collated steps
