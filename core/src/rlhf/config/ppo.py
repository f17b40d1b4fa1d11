"""The configuration tree of ``rlhf train ppo`` — OpenRLHF 0.11's ``train_ppo_ray`` flags.

Names, defaults and meanings follow OpenRLHF 0.11.2 (see docs/config.md). Component
choices (estimator, policy loss, optimizer, scheduler) are plain names resolved
in the plugin registries, so an installed plugin adds choices without touching this file.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Literal

from pydantic import Field

from rlhf.config.base import Section, flag, plugin_flag, plugin_options_field, plugin_set_field
from rlhf.config.sections import (
    AdamSection,
    ChatTemplateFields,
    DeepSpeedSection,
    LoggerSection,
    MuonSection,
    PreemptionFields,
)
from rlhf.registry import ComponentKind as K


class Placement(Section):
    num_nodes: int = flag(1, "number of nodes for this model group")
    num_gpus_per_node: int = flag(8, "number of GPUs per node for this model group (CPU bundles on CPU machines)")


class RefSection(Placement):
    offload: bool = flag(False, "Offload reference model to CPU", switch=True)


class RewardSection(Placement):
    normalize_enable: bool = flag(False, "Enable reward normalization (reward models only)", switch=True)
    clip_range: list[float] = flag([-10.0, 10.0], "Reward clip range", nargs=2)
    overlong_buffer_len: float | None = flag(None, "DAPO overlong penalty buffer length")
    overlong_penalty_factor: float = flag(1.0, "DAPO overlong penalty factor")
    stop_properly_penalty_coef: float | None = flag(
        None, "Penalty for truncated samples: >= 0 scales the reward, < 0 is a fixed reward"
    )
    model_name_or_path: str | None = flag(None, "Reward model path(s), comma-separated")
    remote_url: str | None = flag(None, "Remote reward API URL(s), or a reward_func .py file")
    manager: str = flag("weighted", "Reward manager: how the reward sources make each sample's reward (rlhf plugins "
                        "lists them)", component=K.REWARD_MANAGER)
    functions: str | list[Any] | None = plugin_flag(
        "weighted-rewards", None, "Registered reward functions to combine: name[:weight[:on_error]],… (see docs/rewards.md)"
    )
    on_error: Literal["raise", "zero", "skip-sample"] = plugin_flag("weighted-rewards", "raise",
                                                                    "Default failure policy of reward terms")
    score_term: str | None = plugin_flag("weighted-rewards", None,
                                         "Reward term whose scores drive filtering and eval (default: the weighted sum)")
    offload: bool = flag(False, "Offload reward model to CPU", switch=True)


class TrainSection(Section):
    colocate_actor_ref: bool = flag(False, "Colocate reference and actor on the same devices", switch=True)
    colocate_critic_reward: bool = flag(False, "Colocate critic and reward model on the same devices", switch=True)
    colocate_all: bool = flag(False, "Colocate all models including the rollout engines (hybrid engine)", switch=True)
    colocate: list[str] = flag([], "Groups that share GPUs, each as names joined by '+' (actor, ref, critic, reward, "
                               "engines), e.g. actor+engines ref+reward; beside the colocate_* flags (docs/plan.md)",
                               nargs="+")
    placement_strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = flag(
        "PACK", "Ray placement-group strategy of every model group's bundles: PACK fills a node first (OpenRLHF's), "
        "SPREAD puts the ranks on different nodes where it can")
    in_process: Literal["auto", "on", "off"] = flag(
        "auto", "Model ranks in the controller's own process, outside Ray: auto where the run fits one process (one "
        "rank per model, no RAY_ADDRESS; engine processes only on a Ray cluster without GPUs); off: every rank a Ray actor")
    async_enable: bool = flag(False, "Enable async training", switch=True)
    rollout_scheduler: str = flag("auto", "Rollout scheduler by name (rlhf plugins lists them): sync generates each "
                                  "step's batch in turn, async ahead of training; auto: async with --train.async_enable")
    async_queue_size: int = flag(1, "Queue size between async sampler and trainer")
    partial_rollout_enable: bool = flag(False, "Partial rollout in async mode (pause/resume for weight sync)", switch=True)
    enable_ema: bool = flag(False, "Enable EMA checkpoint for the model", switch=True)
    ema_beta: float = flag(0.992, "EMA beta coefficient")
    dynamic_batch_enable: bool = flag(False, "Dynamic batching by token count", switch=True)
    max_tokens_per_gpu: int = flag(16192, "Token budget per device with dynamic batching")
    num_episodes: int = flag(1, "Passes over the prompt dataset")
    max_epochs: int = flag(1, "Training epochs over each rollout batch")
    micro_batch_size: int = flag(1, "Training batch size per device")
    batch_size: int = flag(128, "Global training batch size")
    seed: int = flag(42, "Random seed")
    full_determinism_enable: bool = flag(False, "Reproducible behaviour during distributed training", switch=True)
    agent_func_path: str | None = flag(None, "Agent file (AgentInstance or AgentExecutor class, OpenRLHF's contract)")
    agent_executor: str | None = flag(
        None, "Registered agent executor (rlhf plugins); default multi_turn with --train.agent_func_path, else single_turn")
    backend: str = flag("deepspeed", "Training backend by name (rlhf plugins lists them): deepspeed (ZeRO, the --ds.* "
                        "flags) or another installed one", component=K.TRAINING_BACKEND)
    model_loaders: list[str] = flag([], "Registered model loaders to apply to every model, in order (besides those whose "
                                    "flags are set)", nargs="+", component=K.MODEL_LOADER)


class TrainedModel(Placement):
    """Fields shared by the actor and critic: optimizer and schedule."""

    optim: str = flag("adam", "Optimizer (a registered optimizer name)", component=K.OPTIMIZER)
    muon: MuonSection = Field(default_factory=MuonSection)
    adam: AdamSection = Field(default_factory=AdamSection)
    lr_scheduler: str = flag("cosine_with_min_lr", "LR scheduler (a registered scheduler name)", component=K.SCHEDULER)
    lr_warmup_ratio: float = flag(0.03, "Warmup steps as a fraction of training steps")
    min_lr_ratio: float = flag(0.1, "Minimum LR as a fraction of the peak LR")
    max_norm: float = flag(1.0, "Gradient clipping norm")
    model_name_or_path: str | None = flag(None, "HF model name or path")


class ActorSection(TrainedModel):
    gradient_checkpointing_enable: bool = flag(False, "Gradient checkpointing", switch=True)
    gradient_checkpointing_reentrant: bool = flag(False, "Reentrant gradient checkpointing", switch=True)
    eps_clip: float = flag(0.2, "PPO clip range")
    eps_clip_low_high: list[float] | None = flag(None, "PPO clip low and high (defaults to eps_clip, eps_clip)", nargs=2)
    dual_clip: float | None = flag(None, "Dual-clip PPO constant c > 1")
    policy_loss_type: str = flag("ppo", "Policy loss (a registered policy loss name)", component=K.POLICY_LOSS)
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean"] = flag("token-mean", "Policy-loss aggregation")
    aux_loss_coef: float = flag(0.0, "MoE balancing loss coefficient")
    routing_replay: Literal["off", "record", "rollout"] = plugin_flag(
        "moe-replay", "off", "MoE routing replay: 'rollout' routes the trainer's forwards by the experts the rollout engine "
        "chose per token and layer; 'record' only records them and logs the mismatch")
    entropy_coef: float | None = flag(None, "Entropy loss coefficient; 0 only logs entropy")
    freeze_visual_encoder: bool = flag(False, "Freeze the vision encoder (train the language model only)", switch=True)


class CriticSection(TrainedModel):
    value_clip: float = flag(0.5, "PPO value clip range")
    freezing_steps: int = flag(-1, "Freeze the actor for the first N steps to warm up the critic")
    save_value_network: bool = flag(False, "Save the critic model", switch=True)
    adam: AdamSection = Field(default_factory=lambda: AdamSection(lr=9e-6))


class VllmSection(Section):
    num_engines: int | None = flag(None, "Number of vLLM engines; 0 disables vLLM (HF generate)")
    tensor_parallel_size: int = flag(1, "Tensor parallel size of each vLLM engine")
    sync_backend: str = flag("auto", "Trainer -> engines weight sync transport: ipc, nccl, gloo, object_store; auto = "
                                      "ipc with --train.colocate_all on CUDA, else nccl on CUDA, gloo on CPU, "
                                      "object_store with LoRA/AutoTP")
    sync_with_ray: bool = flag(False, "Sync weights through Ray collectives", switch=True)
    enable_prefix_caching: bool = flag(False, "vLLM prefix caching", switch=True)
    enforce_eager: bool = flag(False, "Disable CUDA graphs in vLLM", switch=True)
    enable_sleep: bool = flag(False, "vLLM sleep mode (requires --train.colocate_all)", switch=True)
    gpu_memory_utilization: float = flag(0.95, "vLLM gpu_memory_utilization")


class AdvantageSection(Section):
    estimator: str = flag("gae", "Advantage estimator (a registered estimator name)", component=K.ADVANTAGE_ESTIMATOR)
    gamma: float = flag(1.0, "PPO GAE gamma")
    lambd: float = flag(1.0, "PPO GAE lambda")
    no_std_norm: bool = flag(False, "Keep mean subtraction but do not divide advantages by std", switch=True)
    is_correction_level: Literal["off", "token", "seq"] = plugin_flag("rollout-correction", "off",
                                                                      "Train/rollout IS correction granularity")
    is_correction_mode: Literal["mask", "clip"] = plugin_flag("rollout-correction", "mask", "Out-of-band treatment: mask or clip")
    is_correction_gating: Literal["ratio", "binary_kl", "tv"] = plugin_flag("rollout-correction", "ratio",
                                                                            "Statistic the IS gate reads")
    is_correction_threshold: list[float] = plugin_flag("rollout-correction", [0.5, 5.0], "LOW HIGH bounds, or a single HIGH",
                                                       nargs="+")


class KLSection(Section):
    target: float | None = flag(None, "Target KL of the adaptive KL controller")
    horizon: int = flag(10000, "Horizon of the adaptive KL controller")
    init_coef: float = flag(0.01, "KL penalty coefficient; 0 disables the reference model")
    estimator: str = flag("k1", "KL estimator (a registered KL estimator name: k1, k2, k3…)", component=K.KL_ESTIMATOR)
    unbiased_gradient: bool = flag(False, "KL loss: keep the estimator value, backprop the IS-weighted reverse-KL gradient", switch=True)
    use_loss: bool = flag(False, "KL as a loss term (GRPO) instead of in the reward", switch=True)


class AlgoSection(Section):
    preset: str | None = flag(None, "A named recipe (e.g. dapo) that sets several flags; flags and YAML override it",
                                 component=K.PRESET)
    advantage: AdvantageSection = Field(default_factory=AdvantageSection)
    kl: KLSection = Field(default_factory=KLSection)
    dynamic_filtering_enable: bool = flag(False, "DAPO dynamic filtering", switch=True)
    sample_filter: str | None = flag(None, "Registered sample filter for each prompt's sample group "
                                     "(--algo.dynamic_filtering_enable: dynamic_filtering)", component=K.SAMPLE_FILTER)
    dynamic_filtering_range: list[float] = flag([0.0, 1.0], "Dynamic filtering score range", nargs=2)


class EvalSection(Section):
    steps: int = flag(-1, "Evaluate every N steps (-1: never)")
    dataset: str | None = flag(None, "Path to the evaluation dataset")
    split: str = flag("train", "Evaluation dataset split")
    temperature: float = flag(0.6, "Sampling temperature for evaluation")
    n_samples_per_prompt: int = flag(4, "Samples per prompt for evaluation")


class CkptSection(PreemptionFields):
    save_steps: int = flag(-1, "Save a checkpoint every N steps (-1: never)")
    path: str = flag("./ckpt/checkpoints_ppo_ray", "Checkpoint directory")
    save_hf: bool = flag(False, "Also save an HF-loadable model", switch=True)
    disable_ds: bool = flag(False, "Do not save the training backend's states (any --train.backend): checkpoints then hold only the run's state and, with --ckpt.save_hf, the HF model, and no run can resume from them", switch=True)
    max_num: int = flag(3, "Checkpoints to keep")
    max_mem: float = flag(math.inf, "Maximum checkpoint disk use (GB)")
    load_enable: bool = flag(False, "Resume from the latest checkpoint", switch=True)
    best_metric_key: str = plugin_flag("best-checkpoint", "", "Eval metric key for best-checkpoint saving ('' = first pass@ metric)")
    output_dir: str = flag("./ckpt", "Output directory of the final model")


class DataSection(ChatTemplateFields):
    disable_fast_tokenizer: bool = flag(False, "Use the slow tokenizer", switch=True)
    dataloader_num_workers: int = flag(0, "Worker processes that tokenize the prompts (0: in the controller)")
    max_len: int = flag(2048, "Max total sequence length (prompt + response)")
    max_samples: int = flag(100000000, "Max number of samples")
    prompt_dataset: str | None = flag(None, "Prompt dataset path(s) or name(s), comma-separated")
    prompt_source: str | None = flag(None, "A registered prompt source that makes the prompt rows (generated tasks, "
                                     "a taskset, a curriculum) instead of --data.prompt_dataset files",
                                     component=K.PROMPT_SOURCE)
    prompt_probs: str | None = flag(None, "Sampling probabilities of the prompt datasets, comma-separated")
    prompt_split: str = flag("train", "Prompt dataset split")
    input_key: str = flag("input", "Dataset key of the prompt")
    label_key: str | None = flag(None, "Dataset key of the label")
    on_invalid_prompt: Literal["filter", "error"] = flag(
        "filter", "Empty prompts and prompts with no room for a response within max_len: filter (counted) or error")
    input_template: str | None = flag(None, "Prompt template with one {}")
    apply_chat_template: bool = flag(False, "Use the tokenizer's chat template", switch=True)
    processor: str | None = flag(None, "Registered processor that turns each prompt row into ids (default: the one of "
                                 "the model plugin whose flags are set, if any)", component=K.PROCESSOR)
    image_key: str = plugin_flag("vlm", "images", "Dataset key for image paths/URLs")
    max_images_per_prompt: int = plugin_flag("vlm", 0, "Max images per prompt (0 = text-only)")


class RolloutSection(Section):
    engine: str = flag("auto", "Rollout engine by name (rlhf plugins lists them); auto = vllm when "
                               "--vllm.num_engines > 0, else hf-inprocess (HF generate in the actor's ranks, ZeRO-3 "
                               "and FSDP2 shards too, but not with async), else hf (its own process)")
    max_tokens_per_gpu: int | None = flag(None, "Token budget per device for rollout forward passes")
    batch_size: int = flag(1024, "Prompts per rollout batch")
    vllm_generate_batch_size: int | None = flag(None, "Prompts per vLLM generate call (default: rollout.batch_size)")
    micro_batch_size: int = flag(1, "Micro-batch size of experience forward passes, and sequences per HF generate "
                                    "call (the hf engines' chunk)")
    max_new_tokens: int | None = flag(None, "Max new tokens per sample (default: max_len - prompt_len)")
    top_p: float = flag(1.0, "Sampling top-p")
    temperature: float = flag(1.0, "Sampling temperature")
    n_samples_per_prompt: int = flag(1, "Responses per prompt")
    dump_dir: str | None = flag(None, "Write each step's rollouts to DIR/step_<N>.parquet (read them with rlhf rollouts)")
    replay_dir: str | None = flag(None, "Train on the rollouts a run dumped in DIR (--rollout.dump_dir) instead of "
                                        "generating: no rollout engine, no reward source is called")
    generate_only: bool = flag(False, "Generate and reward each step's batch without training (every step samples the "
                                      "initial weights): to check rewards and templates, or build a dataset with "
                                      "--rollout.dump_dir", switch=True)


class PPOConfig(Section):
    """The whole tree of ``rlhf train ppo``."""

    trainer_family: ClassVar[str] = "ppo"  # which lines of rlhf.config.refused.REFUSED apply; the OpenRLHF-compat plugin's table

    ref: RefSection = Field(default_factory=RefSection)
    reward: RewardSection = Field(default_factory=RewardSection)
    train: TrainSection = Field(default_factory=TrainSection)
    actor: ActorSection = Field(default_factory=ActorSection)
    critic: CriticSection = Field(default_factory=CriticSection)
    vllm: VllmSection = Field(default_factory=VllmSection)
    algo: AlgoSection = Field(default_factory=AlgoSection)
    eval: EvalSection = Field(default_factory=EvalSection)
    ckpt: CkptSection = Field(default_factory=CkptSection)
    logger: LoggerSection = Field(default_factory=LoggerSection)
    ds: DeepSpeedSection = Field(default_factory=DeepSpeedSection)
    data: DataSection = Field(default_factory=DataSection)
    rollout: RolloutSection = Field(default_factory=RolloutSection)
    local_rank: int = flag(-1, "local_rank for deepspeed")
    use_ms: bool = flag(False, "Use ModelScope instead of the HF hub", switch=True)
    plugins: dict[str, dict[str, Any]] = plugin_options_field()
    plugin_set: list[dict[str, Any]] = plugin_set_field()
