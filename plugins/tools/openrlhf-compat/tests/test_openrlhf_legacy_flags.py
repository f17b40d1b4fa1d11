"""OpenRLHF command lines from before the dotted flags (<= 0.9) and the 0.11 README's spellings.

Each old command line must dump exactly the config its hand-written dotted equivalent dumps
(`--print-config`, the real CLI path: translation, parsing, OpenRLHF's rewrites and checks). A flag that cannot be
translated is refused as the command refuses it, through rlhf's ``main`` in this process: the claim is the one
error line, not the process (tests/test_user_errors.py runs the command's own process).
"""

from __future__ import annotations

import logging
import shlex
import subprocess

import pytest
import yaml
from rlhf_plugin_openrlhf_compat.tables import PPO, SUPERVISED
from rlhf_plugin_openrlhf_compat.translation import translate

from rlhf.cli.main import main
from rlhf.testing.cli import assert_user_error, run_in_process

README_PPO_FLAT = """
--ref_num_nodes 1 --ref_num_gpus_per_node 8 --reward_num_nodes 1 --reward_num_gpus_per_node 8
--critic_num_nodes 1 --critic_num_gpus_per_node 8 --actor_num_nodes 1 --actor_num_gpus_per_node 8
--vllm_num_engines 4 --vllm_tensor_parallel_size 2 --colocate_all_models --vllm_gpu_memory_utilization 0.5
--pretrain OpenRLHF/Llama-3-8b-sft-mixture --reward_pretrain OpenRLHF/Llama-3-8b-rm-700k
--save_path /openrlhf/final/llama3-8b-rlhf --ckpt_path /openrlhf/ckpt/llama3-8b-rlhf --save_hf_ckpt
--micro_train_batch_size 8 --train_batch_size 128 --micro_rollout_batch_size 16 --rollout_batch_size 1024
--n_samples_per_prompt 1 --max_epochs 1 --prompt_max_len 1024 --max_samples 100000 --generate_max_len 1024
--zero_stage 3 --bf16 --actor_learning_rate 5e-7 --critic_learning_rate 9e-6 --init_kl_coef 0.01
--prompt_data OpenRLHF/prompt-collection-v0.1 --input_key context_messages --apply_chat_template --normalize_reward
--gradient_checkpointing --packing_samples --vllm_sync_backend nccl --enforce_eager --vllm_enable_sleep
--deepspeed_enable_sleep --use_wandb TOKEN
"""
README_PPO_DOTTED = """
--ref.num_nodes 1 --ref.num_gpus_per_node 8 --reward.num_nodes 1 --reward.num_gpus_per_node 8
--critic.num_nodes 1 --critic.num_gpus_per_node 8 --actor.num_nodes 1 --actor.num_gpus_per_node 8
--vllm.num_engines 4 --vllm.tensor_parallel_size 2 --train.colocate_all --vllm.gpu_memory_utilization 0.5
--actor.model_name_or_path OpenRLHF/Llama-3-8b-sft-mixture --reward.model_name_or_path OpenRLHF/Llama-3-8b-rm-700k
--ckpt.output_dir /openrlhf/final/llama3-8b-rlhf --ckpt.path /openrlhf/ckpt/llama3-8b-rlhf --ckpt.save_hf
--train.micro_batch_size 8 --train.batch_size 128 --rollout.micro_batch_size 16 --rollout.batch_size 1024
--rollout.n_samples_per_prompt 1 --train.max_epochs 1 --data.max_len 2048 --data.max_samples 100000
--rollout.max_new_tokens 1024 --ds.zero_stage 3 --ds.param_dtype bf16 --actor.adam.lr 5e-7 --critic.adam.lr 9e-6
--algo.kl.init_coef 0.01 --data.prompt_dataset OpenRLHF/prompt-collection-v0.1 --data.input_key context_messages
--data.apply_chat_template --reward.normalize_enable --actor.gradient_checkpointing_enable --ds.packing_samples
--vllm.sync_backend nccl --vllm.enforce_eager --vllm.enable_sleep --ds.enable_sleep --logger.wandb.key TOKEN
"""
#: a small PPO base every estimator case adds to (OpenRLHF's examples/scripts/train_*_ray.sh style)
PPO_BASE_FLAT = ("--pretrain Qwen/Qwen2.5-0.5B-Instruct --prompt_data prompts.jsonl --input_key question "
                 "--label_key answer --apply_chat_template --actor_num_gpus_per_node 2 --critic_num_gpus_per_node 2 "
                 "--ref_num_gpus_per_node 2 --reward_num_gpus_per_node 2 --vllm_num_engines 1 "
                 "--micro_train_batch_size 4 --train_batch_size 32 --micro_rollout_batch_size 8 --rollout_batch_size 16 "
                 "--max_samples 1000 --generate_max_len 512 --prompt_max_len 256 --zero_stage 2 --bf16 --flash_attn ")
PPO_BASE_DOTTED = ("--actor.model_name_or_path Qwen/Qwen2.5-0.5B-Instruct --data.prompt_dataset prompts.jsonl "
                   "--data.input_key question --data.label_key answer --data.apply_chat_template "
                   "--actor.num_gpus_per_node 2 --critic.num_gpus_per_node 2 --ref.num_gpus_per_node 2 "
                   "--reward.num_gpus_per_node 2 --vllm.num_engines 1 --train.micro_batch_size 4 --train.batch_size 32 "
                   "--rollout.micro_batch_size 8 --rollout.batch_size 16 --data.max_samples 1000 "
                   "--rollout.max_new_tokens 512 --data.max_len 768 --ds.zero_stage 2 --ds.param_dtype bf16 "
                   "--ds.attn_implementation flash_attention_2 ")
REMOTE = "--remote_rm_url http://localhost:5000/get_reward "
REMOTE_DOTTED = "--reward.remote_url http://localhost:5000/get_reward "
SFT_BASE_FLAT = ("--max_len 4096 --dataset Open-Orca/OpenOrca --input_key question --output_key response "
                 "--train_batch_size 256 --micro_train_batch_size 2 --max_samples 500000 --pretrain meta-llama/Meta-Llama-3-8B "
                 "--save_path ./checkpoint/llama3-8b-sft --save_steps -1 --logging_steps 1 --eval_steps -1 --zero_stage 2 "
                 "--max_epochs 1 --bf16 --flash_attn --learning_rate 5e-6 --gradient_checkpointing ")
SFT_BASE_DOTTED = ("--data.max_len 4096 --data.dataset Open-Orca/OpenOrca --data.input_key question "
                   "--data.output_key response --train.batch_size 256 --train.micro_batch_size 2 --data.max_samples 500000 "
                   "--model.model_name_or_path meta-llama/Meta-Llama-3-8B --ckpt.output_dir ./checkpoint/llama3-8b-sft "
                   "--ckpt.save_steps -1 --logger.logging_steps 1 --eval.steps -1 --ds.zero_stage 2 --train.max_epochs 1 "
                   "--ds.param_dtype bf16 --ds.attn_implementation flash_attention_2 --adam.lr 5e-6 "
                   "--train.gradient_checkpointing_enable ")
PAIR_BASE_FLAT = ("--save_path ./checkpoint/llama3-8b --save_steps -1 --logging_steps 1 --eval_steps -1 "
                  "--train_batch_size 256 --micro_train_batch_size 1 --pretrain OpenRLHF/Llama-3-8b-sft-mixture --bf16 "
                  "--max_epochs 1 --max_len 8192 --zero_stage 3 --dataset OpenRLHF/preference_dataset_mixture2_and_safe_pku "
                  "--apply_chat_template --chosen_key chosen --rejected_key rejected --flash_attn --packing_samples "
                  "--gradient_checkpointing ")
PAIR_BASE_DOTTED = ("--ckpt.output_dir ./checkpoint/llama3-8b --ckpt.save_steps -1 --logger.logging_steps 1 --eval.steps -1 "
                    "--train.batch_size 256 --train.micro_batch_size 1 --model.model_name_or_path OpenRLHF/Llama-3-8b-sft-mixture "
                    "--ds.param_dtype bf16 --train.max_epochs 1 --data.max_len 8192 --ds.zero_stage 3 "
                    "--data.dataset OpenRLHF/preference_dataset_mixture2_and_safe_pku --data.apply_chat_template "
                    "--data.chosen_key chosen --data.rejected_key rejected --ds.attn_implementation flash_attention_2 "
                    "--ds.packing_samples --train.gradient_checkpointing_enable ")

#: (id, trainer, OpenRLHF <= 0.9 command line, the same run in today's dotted flags)
CASES = [
    ("ppo-readme-hybrid-engine", "ppo", README_PPO_FLAT, README_PPO_DOTTED),
    ("ppo-gae-reward-model", "ppo", PPO_BASE_FLAT + "--reward_pretrain rm --critic_pretrain critic --advantage_estimator gae "
     "--gamma 0.99 --lambd 0.95 --value_clip 0.3 --freezing_actor_steps 5 --normalize_reward --save_value_network",
     PPO_BASE_DOTTED + "--reward.model_name_or_path rm --critic.model_name_or_path critic --algo.advantage.estimator gae "
     "--algo.advantage.gamma 0.99 --algo.advantage.lambd 0.95 --critic.value_clip 0.3 --critic.freezing_steps 5 "
     "--reward.normalize_enable --critic.save_value_network"),
    ("ppo-reinforce++", "ppo", PPO_BASE_FLAT + REMOTE + "--advantage_estimator reinforce --init_kl_coef 1e-4 "
     "--use_kl_loss --kl_estimator k2",
     PPO_BASE_DOTTED + REMOTE_DOTTED + "--algo.advantage.estimator reinforce --algo.kl.init_coef 1e-4 --algo.kl.use_loss "
     "--algo.kl.estimator k2"),
    ("ppo-reinforce-baseline", "ppo", PPO_BASE_FLAT + REMOTE + "--advantage_estimator reinforce_baseline "
     "--n_samples_per_prompt 4 --use_kl_estimator_k3",
     PPO_BASE_DOTTED + REMOTE_DOTTED + "--algo.advantage.estimator reinforce_baseline --rollout.n_samples_per_prompt 4 "
     "--algo.kl.estimator k3"),
    ("ppo-grpo", "ppo", PPO_BASE_FLAT + REMOTE + "--advantage_estimator group_norm --n_samples_per_prompt 8 "
     "--use_kl_loss --kl_estimator k3 --init_kl_coef 1e-3 --actor_learning_rate 1e-6 --temperature 0.8 --top_p 0.95",
     PPO_BASE_DOTTED + REMOTE_DOTTED + "--algo.advantage.estimator group_norm --rollout.n_samples_per_prompt 8 "
     "--algo.kl.use_loss --algo.kl.estimator k3 --algo.kl.init_coef 1e-3 --actor.adam.lr 1e-6 --rollout.temperature 0.8 "
     "--rollout.top_p 0.95"),
    ("ppo-rloo", "ppo", PPO_BASE_FLAT + REMOTE + "--advantage_estimator rloo --n_samples_per_prompt 4 "
     "--no_advantage_std_norm",
     PPO_BASE_DOTTED + REMOTE_DOTTED + "--algo.advantage.estimator rloo --rollout.n_samples_per_prompt 4 "
     "--algo.advantage.no_std_norm"),
    ("ppo-dr-grpo", "ppo", PPO_BASE_FLAT + REMOTE + "--advantage_estimator dr_grpo --n_samples_per_prompt 4 "
     "--init_kl_coef 0",
     PPO_BASE_DOTTED + REMOTE_DOTTED + "--algo.advantage.estimator dr_grpo --rollout.n_samples_per_prompt 4 "
     "--algo.kl.init_coef 0"),
    ("ppo-reward-func-file", "ppo", PPO_BASE_FLAT + "--remote_rm_url /root/reward_func.py --advantage_estimator "
     "group_norm --n_samples_per_prompt 4 --eval_dataset eval.jsonl --eval_steps 10 --eval_temperature 0.6 "
     "--eval_n_samples_per_prompt 4 --best_metric_key eval_default_pass1",
     PPO_BASE_DOTTED + "--reward.remote_url /root/reward_func.py --algo.advantage.estimator group_norm "
     "--rollout.n_samples_per_prompt 4 --eval.dataset eval.jsonl --eval.steps 10 --eval.temperature 0.6 "
     "--eval.n_samples_per_prompt 4 --ckpt.best_metric_key eval_default_pass1"),
    ("ppo-colocate-actor-ref-critic-reward", "ppo", PPO_BASE_FLAT + "--reward_pretrain rm --colocate_actor_ref "
     "--colocate_critic_reward --ref_reward_offload --adam_offload --adam_betas 0.9 0.98 --l2 0.01 --max_norm 0.5",
     PPO_BASE_DOTTED + "--reward.model_name_or_path rm --train.colocate_actor_ref --train.colocate_critic_reward "
     "--ref.offload --reward.offload --ds.adam_offload --actor.adam.betas 0.9 0.98 --critic.adam.betas 0.9 0.98 "
     "--actor.adam.weight_decay 0.01 --critic.adam.weight_decay 0.01 --actor.max_norm 0.5 --critic.max_norm 0.5"),
    ("ppo-dapo-async", "ppo", PPO_BASE_FLAT + REMOTE + "--advantage_estimator group_norm --n_samples_per_prompt 8 "
     "--dynamic_filtering --dynamic_filtering_reward_range 0 1 --eps_clip_low_high 0.2 0.28 --overlong_buffer_len 128 "
     "--overlong_penalty_factor 1.0 --async_train --async_queue_size 2 --partial_rollout "
     "--enable_vllm_is_correction --vllm_is_correction_type icepop --vllm_is_truncated_threshold 0.5 5.0",
     PPO_BASE_DOTTED + REMOTE_DOTTED + "--algo.advantage.estimator group_norm --rollout.n_samples_per_prompt 8 "
     "--algo.dynamic_filtering_enable --algo.dynamic_filtering_range 0 1 --actor.eps_clip_low_high 0.2 0.28 "
     "--reward.overlong_buffer_len 128 --reward.overlong_penalty_factor 1.0 --train.async_enable "
     "--train.async_queue_size 2 --train.partial_rollout_enable --algo.advantage.is_correction_level token "
     "--algo.advantage.is_correction_mode mask --algo.advantage.is_correction_threshold 0.5 5.0"),
    ("ppo-lora", "ppo", PPO_BASE_FLAT + REMOTE + "--advantage_estimator group_norm --n_samples_per_prompt 4 "
     "--lora_rank 64 --lora_alpha 64 --target_modules q_proj v_proj --lora_dropout 0.05",
     PPO_BASE_DOTTED + REMOTE_DOTTED + "--algo.advantage.estimator group_norm --rollout.n_samples_per_prompt 4 "
     "--ds.lora.rank 64 --ds.lora.alpha 64 --ds.lora.target_modules q_proj v_proj --ds.lora.dropout 0.05"),
    ("ppo-ring-attention-ckpt-logging", "ppo", PPO_BASE_FLAT + REMOTE + "--advantage_estimator reinforce "
     "--ring_attn_size 2 --ring_head_stride 2 --packing_samples --save_steps 20 --max_ckpt_num 2 --load_checkpoint "
     "--logging_steps 5 --use_tensorboard logs --wandb_project p --wandb_run_name r --seed 7 --num_episodes 2",
     PPO_BASE_DOTTED + REMOTE_DOTTED + "--algo.advantage.estimator reinforce --ds.ring_attn_size 2 "
     "--ds.ring_attn_head_stride 2 --ds.packing_samples --ckpt.save_steps 20 --ckpt.max_num 2 --ckpt.load_enable "
     "--logger.logging_steps 5 --logger.tensorboard_dir logs --logger.wandb.project p --logger.wandb.run_name r "
     "--train.seed 7 --train.num_episodes 2"),
    ("sft-readme-packing", "sft", SFT_BASE_FLAT + "--packing_samples --use_wandb TOKEN",
     SFT_BASE_DOTTED + "--ds.packing_samples --logger.wandb.key TOKEN"),
    ("sft-input-template", "sft", SFT_BASE_FLAT + "--input_template 'Q: {}\nA: '",
     SFT_BASE_DOTTED + "--data.input_template 'Q: {}\nA: '"),
    ("sft-multiturn", "sft", SFT_BASE_FLAT.replace("--input_key question --output_key response", "--input_key messages")
     + "--multiturn --apply_chat_template --tokenizer_chat_template '{{ messages }}'",
     SFT_BASE_DOTTED.replace("--data.input_key question --data.output_key response", "--data.input_key messages")
     + "--data.multiturn --data.apply_chat_template --data.tokenizer_chat_template '{{ messages }}'"),
    ("sft-pretrain-mode", "sft", SFT_BASE_FLAT + "--pretrain_mode --input_key text",
     SFT_BASE_DOTTED + "--model.pretrain_mode_enable --data.input_key text"),
    ("sft-lora", "sft", SFT_BASE_FLAT + "--lora_rank 64 --lora_alpha 64 --target_modules all-linear --save_hf_ckpt",
     SFT_BASE_DOTTED + "--ds.lora.rank 64 --ds.lora.alpha 64 --ds.lora.target_modules all-linear"),
    ("rm-readme", "rm", PAIR_BASE_FLAT + "--learning_rate 9e-6",
     PAIR_BASE_DOTTED + "--adam.lr 9e-6"),
    ("rm-loss-options", "rm", PAIR_BASE_FLAT + "--loss logexp --margin_loss --compute_fp32_loss --value_head_prefix value_head",
     PAIR_BASE_DOTTED + "--model.loss_type logexp --model.margin_loss_enable --model.compute_fp32_loss_enable "
     "--ds.value_head_prefix value_head"),
    ("dpo-readme", "dpo", PAIR_BASE_FLAT + "--learning_rate 5e-7 --beta 0.1 --ref_offload",
     PAIR_BASE_DOTTED + "--adam.lr 5e-7 --model.beta 0.1 --ref.offload"),
    ("dpo-ipo-nll-ref", "dpo", PAIR_BASE_FLAT + "--ipo --label_smoothing 0.1 --nll_loss_coef 0.2 --ref_pretrain ref "
     "--prompt_key prompt --lr_warmup_ratio 0.05 --lr_scheduler cosine_with_min_lr --adam_betas 0.9 0.99",
     PAIR_BASE_DOTTED + "--model.ipo_enable --model.label_smoothing 0.1 --model.nll_loss_coef 0.2 "
     "--ref.model_name_or_path ref --data.prompt_key prompt --train.lr_warmup_ratio 0.05 "
     "--train.lr_scheduler cosine_with_min_lr --adam.betas 0.9 0.99"),
    ("dpo-lora", "dpo", PAIR_BASE_FLAT + "--lora_rank 32 --lora_alpha 32 --target_modules q_proj k_proj v_proj",
     PAIR_BASE_DOTTED + "--ds.lora.rank 32 --ds.lora.alpha 32 --ds.lora.target_modules q_proj k_proj v_proj"),
    ("kto", "kto", SFT_BASE_FLAT + "--beta 0.1 --desirable_loss_weight 1.5 --undesirable_loss_weight 0.5 --label_key label",
     SFT_BASE_DOTTED + "--model.beta 0.1 --model.desirable_loss_weight 1.5 --model.undesirable_loss_weight 0.5 "
     "--data.label_key label"),
    ("kd", "kd", SFT_BASE_FLAT + "--teacher_model teacher --teacher_offload --kd_coef 0.5",
     SFT_BASE_DOTTED + "--teacher.model_name_or_path teacher --teacher.offload --model.kd_coef 0.5"),
    ("prm", "prm", "--pretrain m --dataset d.jsonl --input_key input --label_key value --placeholder_token ки "
     "--reward_tokens + - --train_batch_size 16 --micro_train_batch_size 4 --learning_rate 1e-6 --max_len 1024",
     "--model.model_name_or_path m --data.dataset d.jsonl --data.input_key input --data.label_key value "
     "--model.placeholder_token ки --model.reward_tokens + - --train.batch_size 16 --train.micro_batch_size 4 "
     "--adam.lr 1e-6 --data.max_len 1024"),
]


@pytest.fixture(autouse=True)
def _lift_refusals(monkeypatch: pytest.MonkeyPatch) -> None:
    """Translation is checked for every OpenRLHF option, including those this runtime refuses to run with
    (tests/test_option_coverage.py checks the refusals)."""
    monkeypatch.setattr("rlhf.config.refused.REFUSED", {})


def dumped_config(trainer: str, argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict:
    assert main(["train", trainer, *argv, "--print-config"]) == 0
    dump = yaml.safe_load(capsys.readouterr().out)
    dump["logger"]["wandb"].pop("run_name")  # the default is the time of parsing
    return dump


@pytest.mark.parametrize(("trainer", "flat", "dotted"), [case[1:] for case in CASES], ids=[case[0] for case in CASES])
def test_old_command_line_gives_the_dotted_config(trainer: str, flat: str, dotted: str, capsys, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="rlhf.openrlhf_compat"):
        old = dumped_config(trainer, shlex.split(flat), capsys)
    notices = [r.getMessage() for r in caplog.records if "OpenRLHF's old flags" in r.getMessage()]
    assert len(notices) == 1, notices  # one deprecation line per run
    assert old == dumped_config(trainer, shlex.split(dotted), capsys)
    # the line's command line is itself the same run
    printed = notices[0].split(f"rlhf train {trainer} ", 2)[-1].split("   (see ")[0]
    assert dumped_config(trainer, bash_words(printed.removesuffix(" --print-config")), capsys) == old


def bash_words(command_line: str) -> list[str]:
    """The words bash makes of a command line (its quoting, $'…' included)."""
    out = subprocess.run(["bash", "-c", f"printf '%s\\0' {command_line}"], capture_output=True, text=True, check=True)
    return out.stdout.split("\0")[:-1]


def test_at_least_twenty_real_command_lines() -> None:
    assert len(CASES) >= 20
    assert {case[1] for case in CASES} >= {"ppo", "sft", "rm", "dpo"}


@pytest.mark.parametrize(("readme", "canonical"), [
    ("--algo.advantage.is_correction_enable --algo.advantage.is_correction_type tis",
     "--algo.advantage.is_correction_level token --algo.advantage.is_correction_mode clip"),
    ("--algo.advantage.is_correction_enable --algo.advantage.is_correction_type icepop "
     "--algo.advantage.is_correction_threshold 0.5 2.0",
     "--algo.advantage.is_correction_level token --algo.advantage.is_correction_mode mask "
     "--algo.advantage.is_correction_threshold 0.5 2.0"),
    ("--algo.advantage.is_correction_type seq-mask-tis --algo.advantage.is_correction_enable",
     "--algo.advantage.is_correction_level seq --algo.advantage.is_correction_mode mask"),
    ("--algo.advantage.is_correction_enable",  # 0.11.0's default type is tis
     "--algo.advantage.is_correction_level token --algo.advantage.is_correction_mode clip"),
], ids=["tis", "icepop", "seq-mask-tis", "enable-alone"])
def test_0_11_readme_is_correction_spellings(readme: str, canonical: str, capsys) -> None:
    base = shlex.split(PPO_BASE_DOTTED + REMOTE_DOTTED)
    old = dumped_config("ppo", base + shlex.split(readme), capsys)
    assert old == dumped_config("ppo", base + shlex.split(canonical), capsys)
    assert "is_correction_enable" not in str(old) and "is_correction_type" not in str(old)  # the canonical form


def test_0_11_readme_pretrain_mode_spelling(capsys) -> None:
    base = shlex.split(SFT_BASE_DOTTED)
    old = dumped_config("sft", base + ["--actor.pretrain_mode_enable"], capsys)
    assert old["model"]["pretrain_mode_enable"] is True
    assert old == dumped_config("sft", base + ["--model.pretrain_mode_enable"], capsys)


def _readme_0_11_spelling(dotted: str) -> str:
    """A dotted supervised command line as OpenRLHF 0.11's README writes its SFT/RM commands: PPO's actor
    spellings for the model and gradient checkpointing, flat preference keys mixed in."""
    for today, readme in (("--model.model_name_or_path", "--actor.model_name_or_path"),
                          ("--train.gradient_checkpointing_enable", "--actor.gradient_checkpointing_enable"),
                          ("--data.chosen_key", "--chosen_key"), ("--data.rejected_key", "--rejected_key")):
        dotted = dotted.replace(today, readme)
    return dotted


@pytest.mark.parametrize(("trainer", "dotted"), [("sft", SFT_BASE_DOTTED), ("rm", PAIR_BASE_DOTTED),
                                                 ("dpo", PAIR_BASE_DOTTED)])
def test_0_11_readme_supervised_commands_run_with_one_warning(trainer: str, dotted: str, capsys, caplog) -> None:
    readme = _readme_0_11_spelling(dotted)
    assert "--actor.model_name_or_path" in readme and "--actor.gradient_checkpointing_enable" in readme
    with caplog.at_level(logging.WARNING, logger="rlhf.openrlhf_compat"):
        old = dumped_config(trainer, shlex.split(readme), capsys)
    warnings = [r.getMessage() for r in caplog.records if r.name == "rlhf.openrlhf_compat"]
    caplog.clear()
    assert old == dumped_config(trainer, shlex.split(dotted), capsys)
    assert len(warnings) == 1, warnings
    assert "--actor.model_name_or_path -> --model.model_name_or_path" in warnings[0]
    assert "--actor.gradient_checkpointing_enable -> --train.gradient_checkpointing_enable" in warnings[0]
    if trainer != "sft":
        assert "--chosen_key -> --data.chosen_key" in warnings[0]


def test_is_correction_type_without_enable_has_no_effect_as_in_openrlhf(capsys, caplog) -> None:
    base = shlex.split(PPO_BASE_DOTTED + REMOTE_DOTTED)
    dump = dumped_config("ppo", base + ["--algo.advantage.is_correction_type", "icepop"], capsys)
    assert dump["algo"]["advantage"]["is_correction_level"] == "off"
    assert "has no effect without --algo.advantage.is_correction_enable" in caplog.text


@pytest.mark.parametrize(("argv", "names"), [
    (["train", "ppo", "--pretrain", "a", "--actor.model_name_or_path", "b"], ["--pretrain", "--actor.model_name_or_path"]),
    (["train", "ppo", "--bf16", "--ds.param_dtype", "fp32"], ["--bf16", "--ds.param_dtype"]),
    (["train", "ppo", "--prompt_max_len", "10", "--max_len", "20"], ["--prompt_max_len", "--max_len", "--data.max_len"]),
    (["train", "sft", "--pretrain_mode", "--actor.pretrain_mode_enable"], ["--pretrain_mode", "--actor.pretrain_mode_enable"]),
    (["train", "ppo", "--algo.advantage.is_correction_enable", "--algo.advantage.is_correction_type", "tis",
      "--algo.advantage.is_correction_level", "seq"],
     ["--algo.advantage.is_correction_type", "--algo.advantage.is_correction_level"]),
], ids=["pretrain", "bf16", "max-len", "pretrain-mode", "is-correction"])
def test_mixing_old_and_new_spellings_of_one_option_names_both(argv: list[str], names: list[str]) -> None:
    assert_user_error(run_in_process(*argv, "--print-config"), *names)


@pytest.mark.parametrize(("argv", "names"), [
    (["train", "ppo", "--pretrain_data", "pile", "--ptx_coef", "0.05"], ["--pretrain_data", "rlhf train sft"]),
    (["train", "ppo", "--enable_accuracy_filter"], ["--enable_accuracy_filter", "--algo.dynamic_filtering_enable"]),
    (["train", "sft", "--beta", "0.1"], ["--beta", "--model.beta", "rlhf train sft"]),
    (["train", "ppo", "--vllm_is_correction_type", "bogus"], ["--vllm_is_correction_type", "tis, icepop, seq-mask-tis"]),
], ids=["ptx", "accuracy-filter", "dpo-flag-on-sft", "bad-choice"])
def test_flags_that_cannot_be_translated_are_user_errors(argv: list[str], names: list[str]) -> None:
    assert_user_error(run_in_process(*argv, "--print-config"), *names)


def test_ignored_flags_are_named_in_the_notice() -> None:
    translation = translate(["--save_hf_ckpt", "--pretrain", "m"], SUPERVISED)
    assert translation.argv == ["--model.model_name_or_path", "m"]
    assert "--save_hf_ckpt ignored (the supervised trainers always save" in translation.message("rlhf train sft")


def test_inline_values_and_fanout() -> None:
    translation = translate(["--pretrain=m", "--adam_betas", "0.9", "0.95", "--", "x"], PPO)
    assert translation.argv == ["--actor.model_name_or_path=m", "--actor.adam.betas", "0.9", "0.95",
                                "--critic.adam.betas", "0.9", "0.95", "--", "x"]


def test_every_table_target_is_a_flag_of_its_trainers() -> None:
    """No entry of the PPO/supervised tables points at a flag that does not exist (typos in the table)."""
    from rlhf_plugin_openrlhf_compat.tables import Rename, Sum, Switch

    from rlhf.config.loading import ConfigParser
    from rlhf.host.plugin_host import PluginHost
    from rlhf.host.selection import PluginSelection
    from rlhf.registry import ComponentKind

    host = PluginHost.load(PluginSelection.from_cli(None, False))
    flags_of = {name: set(ConfigParser(host.registry.get(ComponentKind.TRAINER, name).config_class, host,
                                       prog=name).flags) for name in ("ppo", "sft", "rm", "dpo", "kto", "prm", "kd")}
    for table, trainers in ((PPO, ["ppo"]), (SUPERVISED, ["sft", "rm", "dpo", "kto", "prm", "kd"])):
        everything = set().union(*(flags_of[t] for t in trainers))
        for old, entry in table.items():
            targets = {Rename: lambda e: e.to, Switch: lambda e: e.tokens, Sum: lambda e: (e.to,)}.get(type(entry))
            for target in (t for t in (targets(entry) if targets else ()) if t.startswith("--")):
                assert target in everything or target in table, f"{old} -> {target}: no such flag"


def test_docs_migration_table_is_generated_from_the_tables() -> None:
    from pathlib import Path

    from rlhf_plugin_openrlhf_compat.translation import migration_markdown

    doc = (Path(__file__).parents[4] / "docs" / "config.md").read_text()
    section = doc.split("<!-- migration-table:start -->\n", 1)[1].split("<!-- migration-table:end -->", 1)[0]
    assert section == migration_markdown(), (
        "docs/config.md's migration table is stale; regenerate it between its markers with "
        "`python -c 'from rlhf_plugin_openrlhf_compat.translation import migration_markdown; print(migration_markdown(), end=\"\")'`")
    assert "## Migrating from OpenRLHF 0.9" in doc  # the anchor the deprecation line points to


#: Every flat flag of OpenRLHF's READMEs that issue 15 lists.
README_FLAT_FLAGS = """--pretrain --reward_pretrain --critic_pretrain --save_path --ckpt_path --save_steps --logging_steps --eval_steps
--micro_train_batch_size --train_batch_size --micro_rollout_batch_size --rollout_batch_size --max_epochs --max_samples
--max_len --prompt_max_len --generate_max_len --zero_stage --bf16 --flash_attn --gradient_checkpointing --adam_offload
--learning_rate --actor_learning_rate --critic_learning_rate --init_kl_coef --use_kl_loss --kl_estimator
--advantage_estimator --n_samples_per_prompt --normalize_reward --remote_rm_url --prompt_data --dataset --input_key
--output_key --label_key --chosen_key --rejected_key --input_template --apply_chat_template --tokenizer_chat_template
--multiturn --pretrain_mode --packing_samples --ring_attn_size --ring_head_stride --lora_rank --lora_alpha
--target_modules --load_checkpoint --save_hf_ckpt --use_wandb --actor_num_nodes --actor_num_gpus_per_node
--critic_num_nodes --critic_num_gpus_per_node --ref_num_nodes --ref_num_gpus_per_node --reward_num_nodes
--reward_num_gpus_per_node --colocate_actor_ref --colocate_critic_reward --colocate_all_models --vllm_num_engines
--vllm_tensor_parallel_size --vllm_gpu_memory_utilization --vllm_sync_backend --vllm_enable_sleep
--deepspeed_enable_sleep --enforce_eager --async_train --dynamic_filtering --is_rm --model_path --lora_path
--output_path""".split()


def test_every_flat_flag_of_the_readmes_has_a_meaning() -> None:
    import argparse

    from rlhf_plugin_lora_merge.command import LoraCommand
    from rlhf_plugin_openrlhf_compat.tables import TABLES

    lora = argparse.ArgumentParser(prog="rlhf lora")
    LoraCommand.add_arguments(lora)
    lora_merge = lora._subparsers._group_actions[0].choices["merge"]
    native = set(lora_merge._option_string_actions)  # lora_combiner's flags are rlhf lora merge's
    missing = [flag for flag in README_FLAT_FLAGS if flag not in native and not any(flag in t for t in TABLES.values())]
    assert not missing
