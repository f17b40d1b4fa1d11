"""Three OpenRLHF <= 0.9 command lines, unchanged, running tiny trainings end to end (PPO, SFT with packing, DPO with LoRA)."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import yaml

from rlhf.cli.main import main
from rlhf.records.metrics import read_metrics
from rlhf.testing.cli import assert_ok, run_rlhf

pytestmark = pytest.mark.slow

NOTICE = "OpenRLHF's old flags were translated"


def sft_and_pair_files(directory: Path) -> tuple[Path, Path]:
    rng = random.Random(0)
    sft, pairs = directory / "sft.jsonl", directory / "pairs.jsonl"
    with sft.open("w") as sft_rows, pairs.open("w") as pair_rows:
        for _ in range(16):
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            sft_rows.write(json.dumps({"question": f"what is {a}+{b}?", "response": str(a + b)}) + "\n")
            pair_rows.write(json.dumps({"prompt": f"what is {a}+{b}?", "chosen": str(a + b), "rejected": "no"}) + "\n")
    return sft, pairs


def test_grpo_command_line_of_openrlhf_0_9(ray_cluster, task_files, tiny_causal_lm_path, tmp_path, caplog) -> None:
    run = tmp_path / "ppo"
    flat = ["--pretrain", str(tiny_causal_lm_path), "--prompt_data", str(task_files["prompts"]), "--label_key", "label",
            "--apply_chat_template", "--max_len", "128", "--max_samples", "8", "--rollout_batch_size", "4",
            "--generate_max_len", "6", "--micro_rollout_batch_size", "8", "--micro_train_batch_size", "8",
            "--train_batch_size", "8", "--actor_learning_rate", "1e-3", "--param_dtype", "fp32",
            "--actor_num_gpus_per_node", "1", "--ref_num_gpus_per_node", "1", "--vllm_num_engines", "0",
            "--remote_rm_url", str(task_files["reward"]), "--advantage_estimator", "group_norm",
            "--n_samples_per_prompt", "2", "--use_kl_loss", "--kl_estimator", "k3", "--init_kl_coef", "1e-3",
            "--save_path", str(run / "out"), "--ckpt_path", str(run / "ckpt")]
    assert main(["train", "ppo", *flat]) == 0
    assert len([r for r in caplog.records if NOTICE in r.getMessage()]) == 1  # one deprecation line per run
    metrics = read_metrics(run / "out")
    assert [m["step"] for m in metrics] == [1, 2]
    recorded = yaml.safe_load((run / "out" / "rlhf_config.yaml").read_text())
    assert recorded["algo"]["advantage"]["estimator"] == "group_norm" and recorded["algo"]["kl"]["use_loss"] is True
    assert recorded["data"]["max_len"] == 128 and recorded["rollout"]["max_new_tokens"] == 6


def test_sft_packing_command_line_of_openrlhf_0_9(tiny_causal_lm_path, tmp_path) -> None:
    sft, _ = sft_and_pair_files(tmp_path)
    out = tmp_path / "sft"
    result = assert_ok(run_rlhf(
        "train", "sft", "--pretrain", str(tiny_causal_lm_path), "--dataset", str(sft), "--input_key", "question",
        "--output_key", "response", "--apply_chat_template", "--max_len", "128", "--train_batch_size", "8",
        "--micro_train_batch_size", "4", "--max_epochs", "1", "--learning_rate", "1e-3", "--param_dtype", "fp32",
        "--zero_stage", "2", "--packing_samples", "--gradient_checkpointing", "--logging_steps", "1",
        "--save_path", str(out)))
    assert result.stderr.count(NOTICE) == 1
    assert "rlhf train sft --model.model_name_or_path" in result.stderr
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in line]
    assert len(steps) == 2 and all(step["loss"] > 0 for step in steps)
    recorded = yaml.safe_load((out / "rlhf_config.yaml").read_text())
    assert recorded["ds"]["packing_samples"] is True and recorded["train"]["gradient_checkpointing_enable"] is True


def test_dpo_lora_command_line_of_openrlhf_0_9(tiny_causal_lm_path, tmp_path) -> None:
    _, pairs = sft_and_pair_files(tmp_path)
    out = tmp_path / "dpo"
    result = assert_ok(run_rlhf(
        "train", "dpo", "--pretrain", str(tiny_causal_lm_path), "--dataset", str(pairs), "--prompt_key", "prompt",
        "--chosen_key", "chosen", "--rejected_key", "rejected", "--apply_chat_template", "--max_len", "128",
        "--train_batch_size", "16", "--micro_train_batch_size", "8", "--max_epochs", "1", "--learning_rate", "1e-3",
        "--beta", "0.1", "--param_dtype", "fp32", "--lora_rank", "4", "--lora_alpha", "8", "--target_modules",
        "q_proj", "v_proj", "--save_path", str(out)))
    assert result.stderr.count(NOTICE) == 1
    assert (out / "adapter_config.json").exists()
    adapter = json.loads((out / "adapter_config.json").read_text())
    assert adapter["r"] == 4 and sorted(adapter["target_modules"]) == ["q_proj", "v_proj"]
    assert any('"loss"' in line for line in (out / "metrics.jsonl").read_text().splitlines())
