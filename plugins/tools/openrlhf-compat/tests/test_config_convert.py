"""`rlhf config convert`: OpenRLHF scripts and command lines -> dotted command lines and YAML configs."""

from __future__ import annotations

import argparse
import subprocess
from pathlib import Path

import pytest
import yaml

from rlhf.cli.main import main
from rlhf.testing.cli import assert_ok, assert_user_error, run_rlhf

# The shapes of OpenRLHF's examples/scripts: ray job submit for PPO, a heredoc fed to the deepspeed launcher for SFT.
SCRIPT = r"""#!/bin/bash
set -x
ray job submit --address="http://127.0.0.1:8265" \
   --runtime-env-json='{"working_dir": "/openrlhf"}' \
   -- python3 -m openrlhf.cli.train_ppo_ray \
   --ref_num_nodes 1 --ref_num_gpus_per_node 2 \
   --actor_num_nodes 1 --actor_num_gpus_per_node 2 \
   --vllm_num_engines 2 --colocate_all_models --vllm_enable_sleep \
   --pretrain OpenRLHF/Llama-3-8b-sft-mixture \
   --remote_rm_url /openrlhf/examples/reward_func.py \
   --save_path /openrlhf/final --micro_train_batch_size 8 --train_batch_size 128 \
   --micro_rollout_batch_size 16 --rollout_batch_size 128 \
   --advantage_estimator group_norm --n_samples_per_prompt 4 \
   --prompt_max_len 1024 --generate_max_len 1024 --zero_stage 3 --bf16 \
   --actor_learning_rate 5e-7 --init_kl_coef 0.01 --use_kl_loss --kl_estimator k3 \
   --prompt_data OpenRLHF/prompt-collection-v0.1 --input_key context_messages --apply_chat_template \
   --use_wandb ${WANDB_TOKEN}   # log to wandb

read -r -d '' training_commands <<EOF
openrlhf.cli.train_sft \
   --max_len 2048 \
   --dataset Open-Orca/OpenOrca \
   --input_key question --output_key response \
   --input_template $'User: {}\nAssistant: ' \
   --train_batch_size 256 --micro_train_batch_size 2 \
   --pretrain meta-llama/Meta-Llama-3-8B --save_path ./checkpoint/llama3-8b-sft \
   --zero_stage 2 --max_epochs 1 --bf16 --flash_attn --learning_rate 5e-6 --gradient_checkpointing --packing_samples
EOF
if [[ ${1} != "slurm" ]]; then
    deepspeed --module $training_commands
fi
"""


@pytest.fixture(autouse=True)
def _lift_refusals(monkeypatch: pytest.MonkeyPatch) -> None:
    """Conversion covers every OpenRLHF option, including those this runtime refuses to run with."""
    monkeypatch.setattr("rlhf.config.refused.REFUSED", {})


def dump(trainer: str, argv: list[str], capsys) -> dict:
    assert main(["train", trainer, *argv, "--print-config"]) == 0
    out = yaml.safe_load(capsys.readouterr().out)
    out["logger"]["wandb"].pop("run_name")
    return out


def bash_words(command_line: str) -> list[str]:
    out = subprocess.run(["bash", "-c", f"printf '%s\\0' {command_line}"], capture_output=True, text=True, check=True,
                         env={"WANDB_TOKEN": "${WANDB_TOKEN}"})
    return out.stdout.split("\0")[:-1]


def test_a_script_converts_to_command_lines_and_yaml_that_give_the_same_config(tmp_path: Path, capsys) -> None:
    script = tmp_path / "train.sh"
    script.write_text(SCRIPT)
    assert main(["config", "convert", str(script), "--yaml", str(tmp_path / "run.yaml")]) == 0
    printed = capsys.readouterr().out
    lines = [line for line in printed.splitlines() if line.startswith("rlhf train")]
    assert [line.split()[2] for line in lines] == ["ppo", "sft"]
    assert "line 3: openrlhf.cli.train_ppo_ray" in printed and "line 20: openrlhf.cli.train_sft" in printed
    assert "--pretrain" not in printed and "--data.input_template $'User: {}\\nAssistant: '" in printed
    for line, yaml_file in zip(lines, [tmp_path / "run.yaml", tmp_path / "run-2.yaml"]):
        trainer, argv = line.split()[2], bash_words(line.split(maxsplit=3)[3])
        from_line = dump(trainer, argv, capsys)
        assert from_line == dump(trainer, ["--config", str(yaml_file)], capsys)
    ppo = yaml.safe_load((tmp_path / "run.yaml").read_text())
    assert ppo["algo"] == {"advantage": {"estimator": "group_norm"}, "kl": {"init_coef": 0.01, "use_loss": True,
                                                                             "estimator": "k3"}}
    assert ppo["data"]["max_len"] == 2048 and ppo["logger"]["wandb"]["key"] == "${WANDB_TOKEN}"
    sft = yaml.safe_load((tmp_path / "run-2.yaml").read_text())
    assert sft["data"]["input_template"] == "User: {}\nAssistant: "


def test_a_command_line_after_double_dash(capsys) -> None:
    assert main(["config", "convert", "--", "deepspeed", "--module", "openrlhf.cli.train_dpo", "--pretrain", "m",
                 "--beta", "0.1", "--ref_offload", "--bf16"]) == 0
    out = capsys.readouterr().out
    assert "rlhf train dpo --model.model_name_or_path m --model.beta 0.1 --ref.offload --ds.param_dtype bf16" in out
    assert yaml.safe_load(out.split("--config run.yaml):\n", 1)[1]) == {
        "model": {"model_name_or_path": "m", "beta": 0.1}, "ref": {"offload": True}, "ds": {"param_dtype": "bf16"}}


def test_bare_flags_with_trainer_and_the_inference_commands(capsys) -> None:
    assert main(["config", "convert", "--trainer", "rm", "--", "--pretrain", "m", "--loss", "logexp"]) == 0
    assert "rlhf train rm --model.model_name_or_path m --model.loss_type logexp" in capsys.readouterr().out
    assert main(["config", "convert", "--", "python", "-m", "openrlhf.cli.batch_inference", "--eval_task", "generate_vllm",
                 "--pretrain", "m", "--output_path", "o.jsonl", "--best_of_n", "4"]) == 0
    out = capsys.readouterr().out
    assert "rlhf generate --engine vllm --model m --output o.jsonl --best_of_n 4" in out and "YAML" not in out
    assert main(["config", "convert", "--", "python", "-m", "openrlhf.cli.interactive_chat", "--pretrain", "m", "--bf16"]) == 0
    assert "rlhf chat --model m --dtype bf16" in capsys.readouterr().out
    merge = ["--model_path", "base", "--lora_path", "adapter", "--output_path", "merged", "--is_rm", "--bf16"]
    assert main(["config", "convert", "--", "python", "-m", "openrlhf.cli.lora_combiner", *merge]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("rlhf lora merge"))
    parsed = lora_parser().parse_args(line.split()[2:])  # rlhf lora merge takes lora_combiner's flags as they are
    assert (parsed.model_path, parsed.lora_path, parsed.output_path, parsed.is_rm, parsed.param_dtype) == (
        "base", "adapter", "merged", True, "bf16")


def test_lora_combiner_ds_param_dtype_converts_to_a_merge_that_parses(capsys) -> None:
    """OpenRLHF 0.11's lora_combiner (and its README) spell the dtype --ds.param_dtype."""
    merge = ["--model_path", "base", "--lora_path", "adapter", "--output_path", "merged", "--ds.param_dtype", "fp16"]
    assert main(["config", "convert", "--", "python", "-m", "openrlhf.cli.lora_combiner", *merge]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("rlhf lora merge"))
    assert lora_parser().parse_args(line.split()[2:]).param_dtype == "fp16"
    assert lora_parser().parse_args(["merge", *merge[:-1], "bf16"]).param_dtype == "bf16"


def lora_parser() -> argparse.ArgumentParser:
    """`rlhf lora`'s parser, as the CLI builds it from rlhf-plugin-lora-merge's command."""
    from rlhf_plugin_lora_merge.command import LoraCommand

    parser = argparse.ArgumentParser(prog="rlhf lora")
    LoraCommand.add_arguments(parser)
    return parser


def test_convert_errors_are_one_line(tmp_path: Path) -> None:
    assert_user_error(run_rlhf("config", "convert", "--", "--pretrain", "m"), "--trainer")
    empty = tmp_path / "empty.sh"
    empty.write_text("echo hello\n")
    assert_user_error(run_rlhf("config", "convert", str(empty)), str(empty), "no OpenRLHF command")
    assert_user_error(run_rlhf("config", "convert", "--trainer", "ppo", "--", "--pretrain", "m", "--ptx_coef", "0.1"),
                      "--ptx_coef")
    assert_user_error(run_rlhf("config", "convert", "--trainer", "ppo", "--", "--train_batch_size", "abc"),
                      "--train.batch_size")
    assert_ok(run_rlhf("config", "convert", "--help"))


def test_serve_rm_converts_to_rlhf_serve_reward_and_runs_as_it_is(capsys) -> None:
    """OpenRLHF 0.11's serve_rm flags (and 0.9's flat ones) -> `rlhf serve reward`, whose parser takes the result."""
    import argparse

    from rlhf_plugin_reward_server.command import ServeCommand

    old = ["python", "-m", "openrlhf.cli.serve_rm", "--reward.model_name_or_path", "rm", "--reward.normalize_enable",
           "--ds.value_head_prefix", "score", "--data.max_len", "512", "--ds.param_dtype", "bf16", "--port", "6000",
           "--api-key", "k", "--ds.attn_implementation", "flash_attention_2", "--batch_size", "4"]
    assert main(["config", "convert", "--", *old]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("rlhf serve reward"))
    assert line == ("rlhf serve reward --model rm --normalize --max_len 512 --dtype bf16 --port 6000 --api_key k "
                    "--batch_size 4")
    parser = argparse.ArgumentParser()
    ServeCommand.add_arguments(parser)
    args = parser.parse_args(line.split()[3:])  # after `rlhf serve reward`
    assert (args.model, args.normalize, args.max_len, args.dtype, args.port, args.batch_size) == ("rm", True, 512, "bf16", 6000, 4)
    assert main(["config", "convert", "--", "python", "-m", "openrlhf.cli.serve_rm", "--reward_pretrain", "rm",
                 "--normalize_reward", "--bf16"]) == 0
    assert "rlhf serve reward --model rm --normalize --dtype bf16" in capsys.readouterr().out
    assert_user_error(run_rlhf("serve", "reward", "--reward.model_name_or_path", "rm", "--ds.value_head_prefix",
                               "value_head"), "--ds.value_head_prefix", "score")
    assert_user_error(run_rlhf("serve", "reward", "--reward_pretrain", "rm", "--use_ms"), "--use_ms", "ModelScope")
