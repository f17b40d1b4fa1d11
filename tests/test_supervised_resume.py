"""Supervised runs: checkpoints, resume after a crash, periodic eval, dataset mixing."""

from __future__ import annotations

import json
import random
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from rlhf_test_support import crash_plugin, runs_in_turn, truncate

from rlhf.records.metrics import read_metrics
from rlhf.testing.cli import assert_ok, assert_user_error, run_in_process

pytestmark = pytest.mark.slow


def _rows(path: Path, count: int, seed: int, word: str) -> Path:
    rng = random.Random(seed)
    with path.open("w") as handle:
        for _ in range(count):
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            handle.write(json.dumps({"input": f"{word} {a}+{b}?", "output": str(a + b)}) + "\n")
    return path


def test_sft_resumes_exactly_where_it_stopped(tmp_path, tiny_causal_lm_path) -> None:
    """A run that crashed after step 3 (its checkpoint is at step 2) resumes from step 2, says so, logs each step
    once, and trains steps 3-8 as the uninterrupted run did; a truncated copy of its checkpoint is refused. All four
    runs are of one rank, in this process."""
    first, second = _rows(tmp_path / "a.jsonl", 40, 0, "add"), _rows(tmp_path / "b.jsonl", 40, 1, "sum")

    def flags(run: Path) -> list[str]:
        return ["train", "sft", "--model.model_name_or_path", str(tiny_causal_lm_path),
                "--data.dataset", f"{first},{second}", "--data.dataset_probs", "0.75,0.25", "--data.max_samples", "40",
                "--eval.holdout", "0.2", "--eval.steps", "2", "--train.batch_size", "8", "--train.micro_batch_size", "4",
                "--train.max_epochs", "2", "--adam.lr", "1e-3", "--ds.param_dtype", "fp32", "--ds.zero_stage", "2",
                "--ckpt.save_steps", "2", "--ckpt.max_num", "2", "--ckpt.path", str(run / "ckpt"),
                "--ckpt.output_dir", str(run / "out")]

    straight, resumed, spoiled = tmp_path / "straight", tmp_path / "resumed", tmp_path / "spoiled"
    assert_ok(run_in_process(*flags(straight)))
    crash = crash_plugin(tmp_path, 3)
    failed = run_in_process("--plugins", str(crash), *flags(resumed), "--ckpt.load_enable")  # nothing to resume yet
    assert failed.returncode != 0 and "simulated crash after step 3" in failed.stderr
    assert f"--ckpt.load_enable: no checkpoint under {resumed / 'ckpt'}; starting from step 0" in failed.stderr
    assert sorted(p.name for p in (resumed / "ckpt").iterdir()) == ["global_step2"]

    shutil.copytree(resumed / "ckpt", spoiled / "ckpt")
    truncate(spoiled / "ckpt" / "global_step2" / "model" / "mp_rank_00_model_states.pt")
    assert_user_error(run_in_process(*flags(spoiled), "--ckpt.load_enable"),
                      f"checkpoint {spoiled / 'ckpt' / 'global_step2' / 'model'} cannot be loaded", "truncated or corrupt")

    result = assert_ok(run_in_process(*flags(resumed), "--ckpt.load_enable"))
    assert f"--ckpt.load_enable: resumed from {resumed / 'ckpt' / 'global_step2'} (step 2)" in result.stderr

    a, b = read_metrics(straight / "out"), read_metrics(resumed / "out")
    train_a = {m["step"]: m["loss"] for m in a if "loss" in m}
    train_b = {m["step"]: m["loss"] for m in b if "loss" in m}
    assert sorted(train_a) == list(range(1, 9))  # 32 training rows (8 held out) / 8 per step × 2 epochs
    assert [m["step"] for m in b if "loss" in m] == list(range(1, 9))  # step 3 of the crashed run was dropped
    for step in range(3, 9):
        assert train_b[step] == pytest.approx(train_a[step], rel=1e-5), step
    evals = [m["step"] for m in a if "eval/loss" in m]
    assert evals == [2, 4, 6, 8]  # --eval.steps 2, the last one at the end
    assert sorted(p.name for p in (straight / "ckpt").iterdir()) == ["global_step6", "global_step8"]  # max_num 2
    config_text = (straight / "out" / "rlhf_config.yaml").read_text()
    assert "dataset_probs: 0.75,0.25" in config_text and "plugin_set:" in config_text


def test_a_checkpoint_of_two_ranks_resumes_on_one(tmp_path, tiny_causal_lm_path, capsys) -> None:
    """One rank resumes a 2-rank run from its step-2 checkpoint (alone under a new --ckpt.path, as a crash after step
    2 leaves it), converted once to DeepSpeed's universal form (by --ds.use_universal_ckpt, as OpenRLHF's command
    lines ask, at ZeRO-2; on its own at ZeRO-3: the checkpoint records 2 ranks), and steps 3-6 have the losses of the
    uninterrupted 2-rank run (the step's loss is a global mean, however it is split). The ZeRO-3 one also resumes
    under --train.backend fsdp2, and that run's step-4 checkpoint back under DeepSpeed ZeRO-3 (resumed_under). The
    two 2-rank runs take turns in one launch (runs_in_turn). A crashed run's resume:
    test_sft_resumes_exactly_where_it_stopped."""
    data = _rows(tmp_path / "a.jsonl", 24, 0, "add")
    extra = {2: ["--ds.use_universal_ckpt"], 3: []}

    def flags_at(stage: int) -> Callable[[Path], list[str]]:
        def flags(run: Path) -> list[str]:
            return ["train", "sft", "--model.model_name_or_path", str(tiny_causal_lm_path), "--data.dataset", str(data),
                    "--train.batch_size", "8", "--train.micro_batch_size", "2", "--train.max_epochs", "2",
                    "--adam.lr", "1e-3", "--ds.param_dtype", "fp32", "--ds.zero_stage", str(stage), *extra[stage],
                    "--ds.attn_implementation", "eager", "--ckpt.save_steps", "2", "--ckpt.path", str(run / "ckpt"),
                    "--ckpt.output_dir", str(run / "out")]
        return flags

    straight = {stage: tmp_path / f"zero{stage}" / "straight" for stage in extra}
    for run in runs_in_turn(tmp_path / "launch", 2, *(tuple(flags_at(stage)(straight[stage])) for stage in extra)):
        assert_ok(run)
    for stage in extra:
        _resumes_on_one(stage, straight[stage], flags_at(stage), tiny_causal_lm_path, capsys)


def _resumes_on_one(stage: int, straight: Path, flags: Callable[[Path], list[str]], base: Path,
                    capsys: pytest.CaptureFixture[str]) -> None:
    """The checks of test_a_checkpoint_of_two_ranks_resumes_on_one for the 2-rank run in ``straight``."""
    resumed = straight.parent / "resumed"
    checkpoint = resumed / "ckpt" / "global_step2"
    shutil.copytree(straight / "ckpt" / "global_step2", checkpoint)
    recorded = json.loads((checkpoint / "state.json").read_text())
    assert recorded["models"]["model"] == {"backend": "deepspeed", "world_size": 2, "ema": False, "lora_rank": 0,
                                           "layout": {"zero_stage": stage, "tensor_parallel_size": 1},
                                           "model": str(base), "states": True}
    assert recorded["config"]["ds"]["zero_stage"] == stage

    if stage == 3:  # (--ds.use_universal_ckpt is a DeepSpeed flag FSDP2 refuses first): to FSDP2 at step 2, and back
        on_fsdp2 = resumed_under("fsdp2", straight, checkpoint, straight.parent / "fsdp2", flags)
        resumed_under("deepspeed", straight, on_fsdp2 / "ckpt" / "global_step4", straight.parent / "back", flags)

    (resumed / "out").mkdir(exist_ok=True)  # and the metrics of its steps 1-2: steps 3-6 must come from the resumed run
    rows = (straight / "out" / "metrics.jsonl").read_text().splitlines(keepends=True)
    (resumed / "out" / "metrics.jsonl").write_text("".join(r for r in rows if json.loads(r)["step"] <= 2))
    resumed_on_one = assert_ok(run_in_process(*flags(resumed), "--ckpt.load_enable"))  # in this process
    assert "global_step2 (step 2)" in resumed_on_one.stderr  # it did resume (a fresh start would give these losses too)
    assert f"{checkpoint} was written by another allocation (model: 2 ranks -> 1)" in resumed_on_one.stderr
    assert (f"checkpoint {checkpoint / 'model'} (written by 2 data-parallel ranks, loaded by 1): converted to "
            f"DeepSpeed's universal form {checkpoint / 'model_universal'} in ") in resumed_on_one.stderr
    assert (checkpoint / "model_universal" / "zero").is_dir()

    losses = {run: {m["step"]: m["loss"] for m in read_metrics(run / "out")} for run in (straight, resumed)}
    assert sorted(losses[resumed]) == list(range(1, 7))
    for step in range(3, 7):
        assert losses[resumed][step] == pytest.approx(losses[straight][step], rel=1e-5), (stage, step)
    if stage == 3:
        inspected_and_exported(straight, base, capsys)


def resumed_under(backend: str, straight: Path, checkpoint: Path, run: Path, flags: Callable[[Path], list[str]]) -> Path:
    """``checkpoint`` (another backend's) resumes on one rank of ``backend`` through the backend-neutral full state
    (the weights, Adam's moments and step by parameter name, the scheduler's position): the steps after it have the
    uninterrupted 2-rank ZeRO-3 run's losses to rel 1e-5 (fp32 throughout; FSDP2 and ZeRO-3 take the same steps to
    that tolerance, test_training_backends_e2e), which a resume with fresh moments (Adam's first steps are
    ~lr x sign(gradient)) or a restarted schedule would miss from its second step on. One line says what was
    converted and how long it took. Returns the resumed run's folder."""
    step = int(checkpoint.name.removeprefix("global_step"))
    writer = json.loads((checkpoint / "state.json").read_text())["models"]["model"]["backend"]
    shutil.copytree(checkpoint, run / "ckpt" / checkpoint.name)
    (run / "out").mkdir(parents=True)
    rows = (straight / "out" / "metrics.jsonl").read_text().splitlines(keepends=True)
    (run / "out" / "metrics.jsonl").write_text("".join(r for r in rows if json.loads(r)["step"] <= step))
    result = assert_ok(run_in_process(*flags(run), "--train.backend", backend, "--ckpt.load_enable"))
    assert "was written by another allocation (model: " in result.stderr  # with the ranks' change, if any
    assert f"--train.backend {writer} -> {backend}" in result.stderr, result.stderr[-3000:]
    line = f"checkpoint {run / 'ckpt' / checkpoint.name / 'model'} (written by --train.backend {writer}): loaded "
    assert line in result.stderr and f" parameters after {step} steps through the backend-neutral full state in " in \
        result.stderr, result.stderr[-3000:]
    losses = {r: {m["step"]: m["loss"] for m in read_metrics(r / "out")} for r in (straight, run)}
    assert sorted(losses[run]) == list(range(1, 7))
    for later in range(step + 1, 7):
        assert losses[run][later] == pytest.approx(losses[straight][later], rel=1e-5), later
    return run


def inspected_and_exported(run: Path, base: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`rlhf checkpoint inspect` of the 2-rank ZeRO-3 run's step-6 checkpoint, and its `export` as an HF model
    whose logits are those of the model the run saved at its end (step 6) to 1e-5."""
    import torch
    from transformers import AutoModelForCausalLM

    checkpoint = run / "ckpt" / "global_step6"
    capsys.readouterr()
    assert_ok(run_in_process("checkpoint", "inspect", str(run / "ckpt"), "--ds.zero_stage", "2", "--adam.lr", "0.001",
                             "--train.batch_size", "16"))
    shown = capsys.readouterr().out
    assert f"checkpoint  {checkpoint}\ncomplete    yes" in shown and "step        6" in shown
    assert "model       --train.backend deepspeed, 2 ranks, zero_stage 3, tensor_parallel_size 1, full model" in shown
    assert "differences --ds.zero_stage: 3 in the checkpoint, 2 here\n            --train.batch_size: 8 in the " \
           "checkpoint, 16 here\n" in shown + "\n"  # --adam.lr 0.001 is the recorded 1e-3
    exported = run / "exported"
    assert_ok(run_in_process("checkpoint", "export", str(checkpoint), "--model", "actor", "--out", str(exported)))
    tokens = torch.randint(5, 200, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        logits = [AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")(
            input_ids=tokens).logits for path in (exported, run / "out")]
    torch.testing.assert_close(logits[0], logits[1], rtol=0, atol=1e-5)
    fresh = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)(input_ids=tokens).logits
    assert (fresh - logits[1]).abs().max() > 1e-3  # trained away from the base, so the equality means something


def test_a_lora_checkpoint_exports_merged_or_as_its_adapter(tmp_path, tiny_causal_lm_path) -> None:
    """A one-rank LoRA sft run (ZeRO-2) checkpoints its last step; `rlhf checkpoint export` of it, merged, computes the logits
    of the run's own final adapter on its base (1e-5), and `--lora adapter` writes an adapter peft loads alike."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    data = _rows(tmp_path / "a.jsonl", 16, 0, "add")
    assert_ok(run_in_process("train", "sft", "--model.model_name_or_path", str(tiny_causal_lm_path), "--data.dataset",
                             str(data), "--train.batch_size", "8", "--train.micro_batch_size", "4", "--adam.lr", "1e-2",
                             "--ds.param_dtype", "fp32", "--ds.lora.rank", "4", "--ds.attn_implementation", "eager",
                             "--ckpt.save_steps", "2", "--ckpt.path", str(tmp_path / "ckpt"),
                             "--ckpt.output_dir", str(tmp_path / "out")))
    for how in ("merged", "adapter"):  # the newest checkpoint: step 4, the run's last (2 epochs of 2 steps)
        exported = assert_ok(run_in_process("checkpoint", "export", str(tmp_path / "ckpt"), "--model", "actor", "--lora",
                                            how, "--out", str(tmp_path / how)))
        # DeepSpeed's zero_to_fp32 bar goes where the run kept its libraries' output, not to the console
        assert exported.stderr == "" and "Loading checkpoint shards" in (tmp_path / "out" / "rlhf.log").read_text()

    def base() -> torch.nn.Module:
        return AutoModelForCausalLM.from_pretrained(tiny_causal_lm_path, dtype=torch.float32, attn_implementation="eager")

    tokens = torch.randint(5, 200, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        trained = PeftModel.from_pretrained(base(), tmp_path / "out")(input_ids=tokens).logits
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32,
                                                      attn_implementation="eager")(input_ids=tokens).logits
        adapter = PeftModel.from_pretrained(base(), tmp_path / "adapter")(input_ids=tokens).logits
        untrained = base()(input_ids=tokens).logits
    torch.testing.assert_close(merged, trained, rtol=0, atol=1e-5)
    torch.testing.assert_close(adapter, trained, rtol=0, atol=1e-5)
    assert (untrained - trained).abs().max() > 1e-3  # the adapter trained, so the equalities mean something
