"""OpenRLHF's older spellings and their dotted equivalents: one table per command family.

OpenRLHF's CLIs took flat flags until the dotted rewrite of 2026-04-19 (0.10): ``--pretrain``,
``--advantage_estimator``… Its 0.11 README still spells a few options its own way
(``--algo.advantage.is_correction_enable``). These tables say what each old spelling means
today; :mod:`rlhf_plugin_openrlhf_compat.translation` applies them to a command line before parsing.
The tables are data only, and docs/config.md's migration table is generated from them.

Entry kinds:

* :class:`Rename` — the flag is renamed; its values (if any) follow unchanged. Several
  targets repeat the values for each (0.9's ``--adam_betas`` set the actor's and the critic's).
* :class:`Switch` — a value-less flag becomes fixed flags and values (``--bf16`` ->
  ``--ds.param_dtype bf16``); ``unless`` names a flag whose presence makes it a no-op.
* :class:`Choice` — the flag's one value picks the replacement (``--algo.advantage.is_correction_type tis``);
  ``requires`` names a flag without which the choice has no effect (as in OpenRLHF).
* :class:`Sum` — the value plus another flag's value (or that flag's old default) goes to ``to``:
  0.9's ``--prompt_max_len`` + ``--generate_max_len`` is today's total ``--data.max_len``.
* :class:`Ignored` — accepted and dropped: the behaviour is built in or does not apply here.
* :class:`Removed` — the feature is gone: an error that names what replaced it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, init=False)
class Rename:
    to: tuple[str, ...]

    def __init__(self, *to: str) -> None:
        object.__setattr__(self, "to", to)


@dataclass(frozen=True)
class Switch:
    tokens: tuple[str, ...]
    unless: str | None = None


@dataclass(frozen=True)
class Choice:
    values: dict[str, tuple[str, ...]]
    requires: str | None = None


@dataclass(frozen=True)
class Sum:
    to: str
    plus: str
    plus_default: int


@dataclass(frozen=True)
class Ignored:
    reason: str


@dataclass(frozen=True)
class Removed:
    replacement: str


Entry = Rename | Switch | Choice | Sum | Ignored | Removed

_IS = "--algo.advantage.is_correction"
#: The named importance-sampling schemes of OpenRLHF 0.9-0.11.0 on 0.11.2's level/mode options (same
#: numbers: the gate reads the ratio pi_train/pi_rollout and the threshold is shared).
IS_CORRECTION_TYPES: dict[str, tuple[str, ...]] = {
    "tis": (f"{_IS}_level", "token", f"{_IS}_mode", "clip"),  # token-level clamp of the ratio
    "icepop": (f"{_IS}_level", "token", f"{_IS}_mode", "mask"),  # token-level mask outside the bounds
    "seq-mask-tis": (f"{_IS}_level", "seq", f"{_IS}_mode", "mask"),  # sequence geometric-mean gate x token ratio
}

#: Spellings of OpenRLHF 0.11's README that 0.11.2's parser does not take (tables below include them).
README_0_11_PPO: dict[str, Entry] = {
    f"{_IS}_enable": Switch(IS_CORRECTION_TYPES["tis"], unless=f"{_IS}_type"),  # 0.11.0's default type is tis
    f"{_IS}_type": Choice(IS_CORRECTION_TYPES, requires=f"{_IS}_enable"),
}
#: Its SFT/RM commands spell the trained model as PPO's actor; the supervised trainers call it ``model``
#: (and put gradient checkpointing under ``train``). Flat ``--chosen_key``/``--rejected_key`` are in SUPERVISED.
README_0_11_SUPERVISED: dict[str, Entry] = {
    "--actor.pretrain_mode_enable": Rename("--model.pretrain_mode_enable"),
    "--actor.model_name_or_path": Rename("--model.model_name_or_path"),
    "--actor.gradient_checkpointing_enable": Rename("--train.gradient_checkpointing_enable"),
}

_SAVES_HF = Ignored("the supervised trainers always save the final model in HF format")
_KEEPS_DS = Ignored("supervised checkpoints hold the model and optimizer state rlhf needs to resume")

#: OpenRLHF 0.11's supervised parsers (``train_sft``, ``train_rm``, ``train_dpo``…) put the optimizer,
#: scheduler and clipping at the top level and gradient checkpointing under ``--model``; rlhf keeps
#: them under ``--train``, as the dotted PPO tree does for each model.
PARSER_0_11_SUPERVISED: dict[str, Entry] = {
    "--model.gradient_checkpointing_enable": Rename("--train.gradient_checkpointing_enable"),
    "--model.gradient_checkpointing_reentrant": Rename("--train.gradient_checkpointing_reentrant"),
    "--optim": Rename("--train.optim"),
    "--min_lr_ratio": Rename("--train.min_lr_ratio"),
    "--ckpt.save_hf": _SAVES_HF,
    "--ckpt.disable_ds": _KEEPS_DS,
}

#: DeepSpeed, LoRA, packing and logging flags: the same in every 0.9 trainer.
_SHARED_0_9: dict[str, Entry] = {
    "--zero_stage": Rename("--ds.zero_stage"),
    "--bf16": Switch(("--ds.param_dtype", "bf16")),
    "--param_dtype": Rename("--ds.param_dtype"),
    "--flash_attn": Switch(("--ds.attn_implementation", "flash_attention_2")),
    "--attn_implementation": Rename("--ds.attn_implementation"),
    "--adam_offload": Rename("--ds.adam_offload"),
    "--zpg": Rename("--ds.zpg"),
    "--grad_accum_dtype": Rename("--ds.grad_accum_dtype"),
    "--overlap_comm": Rename("--ds.overlap_comm"),
    "--deepcompile": Rename("--ds.deepcompile"),
    "--use_liger_kernel": Rename("--ds.use_liger_kernel"),
    "--load_in_4bit": Rename("--ds.load_in_4bit"),
    "--ds_tensor_parallel_size": Rename("--ds.tensor_parallel_size"),
    "--use_ds_universal_ckpt": Rename("--ds.use_universal_ckpt"),
    "--packing_samples": Rename("--ds.packing_samples"),
    "--ring_attn_size": Rename("--ds.ring_attn_size"),
    "--ring_head_stride": Rename("--ds.ring_attn_head_stride"),
    "--lora_rank": Rename("--ds.lora.rank"),
    "--lora_alpha": Rename("--ds.lora.alpha"),
    "--target_modules": Rename("--ds.lora.target_modules"),
    "--lora_dropout": Rename("--ds.lora.dropout"),
    "--value_head_prefix": Rename("--ds.value_head_prefix"),
    "--disable_trace_cache": Ignored("DeepSpeed's trace cache is not used"),
    "--save_steps": Rename("--ckpt.save_steps"),
    "--ckpt_path": Rename("--ckpt.path"),
    "--save_path": Rename("--ckpt.output_dir"),
    "--max_ckpt_num": Rename("--ckpt.max_num"),
    "--max_ckpt_mem": Rename("--ckpt.max_mem"),
    "--load_checkpoint": Rename("--ckpt.load_enable"),
    "--logging_steps": Rename("--logger.logging_steps"),
    "--use_wandb": Rename("--logger.wandb.key"),
    "--wandb_org": Rename("--logger.wandb.org"),
    "--wandb_group": Rename("--logger.wandb.group"),
    "--wandb_project": Rename("--logger.wandb.project"),
    "--wandb_run_name": Rename("--logger.wandb.run_name"),
    "--use_tensorboard": Rename("--logger.tensorboard_dir"),
    "--eval_steps": Rename("--eval.steps"),
    "--eval_dataset": Rename("--eval.dataset"),
    "--eval_split": Rename("--eval.split"),
    "--max_epochs": Rename("--train.max_epochs"),
    "--micro_train_batch_size": Rename("--train.micro_batch_size"),
    "--train_batch_size": Rename("--train.batch_size"),
    "--seed": Rename("--train.seed"),
    "--max_samples": Rename("--data.max_samples"),
    "--max_len": Rename("--data.max_len"),
    "--input_key": Rename("--data.input_key"),
    "--input_template": Rename("--data.input_template"),
    "--apply_chat_template": Rename("--data.apply_chat_template"),
    "--disable_fast_tokenizer": Rename("--data.disable_fast_tokenizer"),
}

#: OpenRLHF <= 0.9's ``train_ppo_ray`` (and ``train_ppo``).
PPO: dict[str, Entry] = {
    **_SHARED_0_9,
    **README_0_11_PPO,
    "--pretrain": Rename("--actor.model_name_or_path"),
    "--reward_pretrain": Rename("--reward.model_name_or_path"),
    "--critic_pretrain": Rename("--critic.model_name_or_path"),
    "--remote_rm_url": Rename("--reward.remote_url"),
    "--agent_func_path": Rename("--train.agent_func_path"),
    "--ref_reward_offload": Switch(("--ref.offload", "--reward.offload")),
    **{f"--{group}_num_nodes": Rename(f"--{group}.num_nodes") for group in ("actor", "critic", "ref", "reward")},
    **{f"--{group}_num_gpus_per_node": Rename(f"--{group}.num_gpus_per_node")
       for group in ("actor", "critic", "ref", "reward")},
    "--colocate_actor_ref": Rename("--train.colocate_actor_ref"),
    "--colocate_critic_reward": Rename("--train.colocate_critic_reward"),
    "--colocate_all_models": Rename("--train.colocate_all"),
    "--vllm_num_engines": Rename("--vllm.num_engines"),
    "--vllm_tensor_parallel_size": Rename("--vllm.tensor_parallel_size"),
    "--vllm_sync_backend": Rename("--vllm.sync_backend"),
    "--vllm_sync_with_ray": Rename("--vllm.sync_with_ray"),
    "--enable_prefix_caching": Rename("--vllm.enable_prefix_caching"),
    "--enforce_eager": Rename("--vllm.enforce_eager"),
    "--vllm_enable_sleep": Rename("--vllm.enable_sleep"),
    "--vllm_gpu_memory_utilization": Rename("--vllm.gpu_memory_utilization"),
    "--deepspeed_enable_sleep": Rename("--ds.enable_sleep"),
    "--async_train": Rename("--train.async_enable"),
    "--async_queue_size": Rename("--train.async_queue_size"),
    "--partial_rollout": Rename("--train.partial_rollout_enable"),
    "--enable_ema": Rename("--train.enable_ema"),
    "--ema_beta": Rename("--train.ema_beta"),
    "--use_dynamic_batch": Rename("--train.dynamic_batch_enable"),
    "--train_max_tokens_per_gpu": Rename("--train.max_tokens_per_gpu"),
    "--rollout_max_tokens_per_gpu": Rename("--rollout.max_tokens_per_gpu"),
    "--num_episodes": Rename("--train.num_episodes"),
    "--full_determinism": Rename("--train.full_determinism_enable"),
    "--micro_rollout_batch_size": Rename("--rollout.micro_batch_size"),
    "--rollout_batch_size": Rename("--rollout.batch_size"),
    "--vllm_generate_batch_size": Rename("--rollout.vllm_generate_batch_size"),
    "--n_samples_per_prompt": Rename("--rollout.n_samples_per_prompt"),
    "--generate_max_len": Rename("--rollout.max_new_tokens"),
    "--prompt_max_len": Sum("--data.max_len", plus="--generate_max_len", plus_default=1024),
    "--top_p": Rename("--rollout.top_p"),
    "--temperature": Rename("--rollout.temperature"),
    "--actor_learning_rate": Rename("--actor.adam.lr"),
    "--critic_learning_rate": Rename("--critic.adam.lr"),
    "--adam_betas": Rename("--actor.adam.betas", "--critic.adam.betas"),
    "--l2": Rename("--actor.adam.weight_decay", "--critic.adam.weight_decay"),
    "--lr_scheduler": Rename("--actor.lr_scheduler", "--critic.lr_scheduler"),
    "--lr_warmup_ratio": Rename("--actor.lr_warmup_ratio", "--critic.lr_warmup_ratio"),
    "--max_norm": Rename("--actor.max_norm", "--critic.max_norm"),
    "--gradient_checkpointing": Rename("--actor.gradient_checkpointing_enable"),
    "--gradient_checkpointing_use_reentrant": Rename("--actor.gradient_checkpointing_reentrant"),
    "--eps_clip": Rename("--actor.eps_clip"),
    "--eps_clip_low_high": Rename("--actor.eps_clip_low_high"),
    "--dual_clip": Rename("--actor.dual_clip"),
    "--policy_loss_type": Rename("--actor.policy_loss_type"),
    "--loss_agg_mode": Rename("--actor.loss_agg_mode"),
    "--entropy_loss_coef": Rename("--actor.entropy_coef"),
    "--aux_loss_coef": Rename("--actor.aux_loss_coef"),
    "--freeze_visual_encoder": Rename("--actor.freeze_visual_encoder"),
    "--value_clip": Rename("--critic.value_clip"),
    "--freezing_actor_steps": Rename("--critic.freezing_steps"),
    "--save_value_network": Rename("--critic.save_value_network"),
    "--advantage_estimator": Rename("--algo.advantage.estimator"),
    "--gamma": Rename("--algo.advantage.gamma"),
    "--lambd": Rename("--algo.advantage.lambd"),
    "--no_advantage_std_norm": Rename("--algo.advantage.no_std_norm"),
    "--init_kl_coef": Rename("--algo.kl.init_coef"),
    "--kl_target": Rename("--algo.kl.target"),
    "--kl_horizon": Rename("--algo.kl.horizon"),
    "--use_kl_loss": Rename("--algo.kl.use_loss"),
    "--kl_estimator": Rename("--algo.kl.estimator"),
    "--use_kl_estimator_k3": Switch(("--algo.kl.estimator", "k3")),
    "--dynamic_filtering": Rename("--algo.dynamic_filtering_enable"),
    "--dynamic_filtering_reward_range": Rename("--algo.dynamic_filtering_range"),
    "--enable_vllm_is_correction": Rename(f"{_IS}_enable"),
    "--vllm_is_correction_type": Rename(f"{_IS}_type"),
    "--vllm_is_truncated_threshold": Rename(f"{_IS}_threshold"),
    "--normalize_reward": Rename("--reward.normalize_enable"),
    "--reward_clip_range": Rename("--reward.clip_range"),
    "--overlong_buffer_len": Rename("--reward.overlong_buffer_len"),
    "--overlong_penalty_factor": Rename("--reward.overlong_penalty_factor"),
    "--stop_properly_penalty_coef": Rename("--reward.stop_properly_penalty_coef"),
    "--eval_temperature": Rename("--eval.temperature"),
    "--eval_n_samples_per_prompt": Rename("--eval.n_samples_per_prompt"),
    "--save_hf_ckpt": Rename("--ckpt.save_hf"),
    "--disable_ds_ckpt": Rename("--ckpt.disable_ds"),
    "--best_metric_key": Rename("--ckpt.best_metric_key"),
    "--prompt_data": Rename("--data.prompt_dataset"),
    "--prompt_data_probs": Rename("--data.prompt_probs"),
    "--prompt_split": Rename("--data.prompt_split"),
    "--label_key": Rename("--data.label_key"),
    "--image_key": Rename("--data.image_key"),
    "--max_images_per_prompt": Rename("--data.max_images_per_prompt"),
    "--pretrain_data": Removed("PPO-ptx (a pretraining loss mixed into PPO) was removed in OpenRLHF 0.8; "
                               "run `rlhf train sft --model.pretrain_mode_enable` on that data separately"),
    "--ptx_coef": Removed("PPO-ptx was removed in OpenRLHF 0.8; run `rlhf train sft --model.pretrain_mode_enable` "
                          "on the pretraining data separately"),
    "--enable_accuracy_filter": Removed("the accuracy filter was replaced by DAPO dynamic filtering: "
                                        "--algo.dynamic_filtering_enable --algo.dynamic_filtering_range LOW HIGH"),
    "--accuracy_lower_bound": Removed("the accuracy filter was replaced by --algo.dynamic_filtering_range LOW HIGH"),
    "--accuracy_upper_bound": Removed("the accuracy filter was replaced by --algo.dynamic_filtering_range LOW HIGH"),
}

#: OpenRLHF <= 0.9's ``train_sft``, ``train_rm``, ``train_dpo``, ``train_kto``, ``train_prm``, ``train_kd``.
SUPERVISED: dict[str, Entry] = {
    **_SHARED_0_9,
    **README_0_11_SUPERVISED,
    **PARSER_0_11_SUPERVISED,
    "--pretrain": Rename("--model.model_name_or_path"),
    "--ref_pretrain": Rename("--ref.model_name_or_path"),
    "--ref_offload": Rename("--ref.offload"),
    "--teacher_model": Rename("--teacher.model_name_or_path"),
    "--teacher_offload": Rename("--teacher.offload"),
    "--learning_rate": Rename("--adam.lr"),
    "--adam_betas": Rename("--adam.betas"),
    "--l2": Rename("--adam.weight_decay"),
    "--lr_scheduler": Rename("--train.lr_scheduler"),
    "--lr_warmup_ratio": Rename("--train.lr_warmup_ratio"),
    "--max_norm": Rename("--train.max_norm"),
    "--gradient_checkpointing": Rename("--train.gradient_checkpointing_enable"),
    "--gradient_checkpointing_use_reentrant": Rename("--train.gradient_checkpointing_reentrant"),
    "--dataset": Rename("--data.dataset"),
    "--dataset_probs": Rename("--data.dataset_probs"),
    "--train_split": Rename("--data.dataset_split"),
    "--output_key": Rename("--data.output_key"),
    "--label_key": Rename("--data.label_key"),
    "--prompt_key": Rename("--data.prompt_key"),
    "--chosen_key": Rename("--data.chosen_key"),
    "--rejected_key": Rename("--data.rejected_key"),
    "--tokenizer_chat_template": Rename("--data.tokenizer_chat_template"),
    "--multiturn": Rename("--data.multiturn"),
    "--pretrain_mode": Rename("--model.pretrain_mode_enable"),
    "--aux_loss_coef": Rename("--model.aux_loss_coef"),
    "--beta": Rename("--model.beta"),
    "--ipo": Rename("--model.ipo_enable"),
    "--label_smoothing": Rename("--model.label_smoothing"),
    "--nll_loss_coef": Rename("--model.nll_loss_coef"),
    "--loss": Rename("--model.loss_type"),
    "--margin_loss": Rename("--model.margin_loss_enable"),
    "--compute_fp32_loss": Rename("--model.compute_fp32_loss_enable"),
    "--kd_coef": Rename("--model.kd_coef"),
    "--desirable_loss_weight": Rename("--model.desirable_loss_weight"),
    "--undesirable_loss_weight": Rename("--model.undesirable_loss_weight"),
    "--placeholder_token": Rename("--model.placeholder_token"),
    "--reward_tokens": Rename("--model.reward_tokens"),
    "--save_hf_ckpt": _SAVES_HF,
    "--disable_ds_ckpt": _KEEPS_DS,
}

#: OpenRLHF's ``batch_inference`` (its ``--eval_task`` picked the engine) for ``rlhf generate``.
GENERATE: dict[str, Entry] = {
    "--pretrain": Rename("--model"),
    "--output_path": Rename("--output"),
    "--bf16": Switch(("--dtype", "bf16")),
    "--flash_attn": Switch(("--attn_implementation", "flash_attention_2")),
    "--eval_task": Choice({"generate": ("--engine", "hf"), "generate_vllm": ("--engine", "vllm"),
                           "rm": ("--score_only",)}),
    "--greedy_sampling": Switch(("--temperature", "0")),
    "--prompt_max_len": Sum("--max_len", plus="--max_new_tokens", plus_default=1024),
    "--zero_stage": Ignored("rlhf generate samples with vLLM or HF generate, without DeepSpeed"),
    "--local_rank": Ignored("rlhf generate runs in one process"),
    "--disable_fast_tokenizer": Ignored("the fast tokenizer is always used"),
}

#: OpenRLHF's ``interactive_chat`` for ``rlhf chat``.
CHAT: dict[str, Entry] = {
    "--pretrain": Rename("--model"),
    "--bf16": Switch(("--dtype", "bf16")),
    "--flash_attn": Switch(("--attn_implementation", "flash_attention_2")),
    "--greedy_sampling": Switch(("--temperature", "0")),
    "--disable_fast_tokenizer": Ignored("the fast tokenizer is always used"),
}

#: OpenRLHF's ``serve_rm`` (flat <= 0.9 flags and 0.11's dotted ones) for ``rlhf serve reward --model``.
_SERVER_LOADS = "rlhf serve reward loads the model with transformers' defaults"
SERVE: dict[str, Entry] = {
    "--reward_pretrain": Rename("--model"),
    "--reward.model_name_or_path": Rename("--model"),
    "--normalize_reward": Rename("--normalize"),
    "--reward.normalize_enable": Rename("--normalize"),
    "--value_head_prefix": Choice({"score": ()}),  # transformers' sequence-classification head, which rlhf's RMs use
    "--ds.value_head_prefix": Choice({"score": ()}),
    "--data.max_len": Rename("--max_len"),
    "--bf16": Switch(("--dtype", "bf16")),
    "--ds.param_dtype": Rename("--dtype"),
    "--api-key": Rename("--api_key"),
    "--flash_attn": Ignored(_SERVER_LOADS),
    "--ds.attn_implementation": Ignored(_SERVER_LOADS),
    "--ds.experts_implementation": Ignored(_SERVER_LOADS),
    "--ds.packing_samples": Ignored("the server scores padded batches"),
    "--load_in_4bit": Ignored("4-bit loading (QLoRA) is a training option; the server loads the model whole"),
    "--ds.load_in_4bit": Ignored("4-bit loading (QLoRA) is a training option; the server loads the model whole"),
    "--disable_fast_tokenizer": Ignored("the fast tokenizer is always used"),
    "--data.disable_fast_tokenizer": Ignored("the fast tokenizer is always used"),
    "--use_ms": Removed("ModelScope downloads are not supported; download the model and pass its directory to --model"),
}

#: Table of each command family; trainers pick theirs by config class (see legacy_translation.table_for).
TABLES: dict[str, dict[str, Entry]] = {"ppo": PPO, "supervised": SUPERVISED, "generate": GENERATE, "chat": CHAT,
                                       "serve reward": SERVE}

#: OpenRLHF modules (``python -m openrlhf.cli.X``) and the rlhf command line that replaces each.
OPENRLHF_MODULES: dict[str, tuple[str, ...]] = {
    "train_ppo_ray": ("train", "ppo"), "train_ppo": ("train", "ppo"), "train_sft": ("train", "sft"),
    "train_rm": ("train", "rm"), "train_dpo": ("train", "dpo"), "train_kto": ("train", "kto"),
    "train_prm": ("train", "prm"), "train_kd": ("train", "kd"), "batch_inference": ("generate",),
    "interactive_chat": ("chat",), "lora_combiner": ("lora", "merge"), "serve_rm": ("serve", "reward"),  # lora merge takes lora_combiner's flags
}
