"""The HF-generate rollout engines: ``transformers`` ``generate`` with the log-probs of what it sampled.

:class:`HFEngine` loads its own copy of the policy in a Ray actor of its own; :class:`InProcessHFEngine`
generates inside each actor training rank with the trained model itself (no second process, no weight
copy, no weight sync). Both sample the same way, so a run gives the same samples with either.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any


def chunk_size(config: dict[str, Any]) -> int:
    """Sequences per ``generate`` call: ``--rollout.micro_batch_size`` (OpenRLHF's ``micro_rollout_batch_size``),
    1 where the config dict leaves it out."""
    return max(1, int(config.get("rollout", {}).get("micro_batch_size") or 1))


class HFEngine:
    """HF ``generate`` in an engine actor of its own (``--rollout.engine hf``; ``auto`` with
    ``--vllm.num_engines 0`` when the actor's weights are split over its ranks by AutoTP).

    Generates ``--rollout.micro_batch_size`` sequences per ``generate`` call, so what it holds beside the weights
    is bounded by that chunk, not by its share of the batch."""

    in_training_rank = False
    records_token_values = True  # the model extensions' records of every generate (MoE routing replay)
    #: whether every ``generate`` runs in step with the other ranks' (an in-rank engine on sharded weights)
    synced = False

    @classmethod
    def auto_preference(cls, config: Any) -> int | None:
        return None if (config.vllm.num_engines or 0) > 0 else 10

    @classmethod
    def plan_memory(cls, config: Any, shape: Any, gpu_memory: int | None) -> list[Any]:
        """One engine's GPU for ``rlhf plan``: its own copy of the weights (none inside a training rank), the KV cache
        of one ``generate`` chunk (``--rollout.micro_batch_size`` sequences, or the engine's whole share of a
        generation batch where that is fewer, every sequence at ``--data.max_len``) and the ``(chunk, V)`` fp32
        log-prob row it keeps from one step to the next."""
        from rlhf.planning import MemoryPart, dtype_bytes

        size = dtype_bytes(config.ds.param_dtype)
        parts = [] if cls.in_training_rank else [MemoryPart("weights", shape.parameters * size, f"{size} B x {shape.parameters:.3g}")]
        rollout = config.rollout
        engines = config.actor.num_nodes * config.actor.num_gpus_per_node if cls.in_training_rank else max(1, config.vllm.num_engines or 0)
        prompts = rollout.vllm_generate_batch_size or rollout.batch_size
        share = -(-prompts * rollout.n_samples_per_prompt // engines)
        chunk = min(rollout.micro_batch_size, share)
        return parts + [MemoryPart("KV cache", shape.kv_cache_bytes(size, chunk, config.data.max_len),
                                   f"{chunk} x {config.data.max_len} tokens (--rollout.micro_batch_size)"),
                        MemoryPart("log-prob row", chunk * shape.vocab * 4, f"{chunk} x {shape.vocab} vocabulary x fp32")]

    def __init__(self, model_path: str, param_dtype: str, max_model_len: int, seed: int, config: dict[str, Any]) -> None:
        import torch

        from rlhf.devices import local_device
        from rlhf.models.extensions import engine_extensions
        from rlhf.models.loading import load_generative

        dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[param_dtype]
        self.chunk_size = chunk_size(config)
        self.extensions = engine_extensions(config)  # model plugins that record per-token values (e.g. routed experts)
        self._use(load_generative(model_path, dtype).to(local_device()).eval())  # the GPU Ray gave this actor, if any

    def _use(self, model: Any) -> None:
        """Generate with ``model`` (an HF generative model, or a PEFT model around one)."""
        from rlhf.models.loading import token_id

        self.model = model
        self.pad_id = token_id(model, "pad_token_id") or 0
        eos = model.generation_config.eos_token_id or token_id(model, "eos_token_id")
        self.eos_ids = set(eos) if isinstance(eos, (list, tuple)) else {eos}  # Llama-3 style lists too
        # a VLM's image/video placeholders are the processor's to place: a sampled one would break the training forward
        placeholders = [getattr(model.config, key, None) for key in ("image_token_id", "video_token_id")]
        self.suppressed = [t for t in placeholders if t is not None] or None

    def generate(self, requests: list[dict[str, Any]], temperature: float, top_p: float) -> list[dict[str, Any]]:
        """The requests in chunks of ``--rollout.micro_batch_size`` (one ``generate`` call each), in order."""
        results: list[dict[str, Any]] = []
        for start in range(0, len(requests), self.chunk_size):
            results += self._generate_chunk(requests[start : start + self.chunk_size], temperature, top_p)
        return results

    def _generate_chunk(self, requests: list[dict[str, Any]], temperature: float, top_p: float) -> list[dict[str, Any]]:
        """One ``generate`` call, left-padded, seeded by the chunk's first request. Memory: the chunk's KV cache
        and one ``(chunk, V)`` fp32 log-prob row (:class:`~rlhf_plugin_hf_generate.sampled.SampledLogprobs`)."""
        import torch
        from transformers import LogitsProcessorList

        from rlhf.media import collate_media
        from rlhf.models.extensions import recording
        from rlhf_plugin_hf_generate.sampled import SampledLogprobs

        width = max(len(r["prompt_ids"]) for r in requests)
        input_ids = torch.full((len(requests), width), self.pad_id, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        for i, r in enumerate(requests):  # left padding
            input_ids[i, width - len(r["prompt_ids"]) :] = torch.tensor(r["prompt_ids"])
            attention[i, width - len(r["prompt_ids"]) :] = 1
        device = self.model.device
        media = collate_media([r.get("media") for r in requests])  # a VLM's images, in request order
        torch.manual_seed(requests[0]["seed"])
        sample = temperature > 0
        recorder = SampledLogprobs(temperature if sample else 1.0, self.suppressed)
        with torch.no_grad(), policy_sampling(self.model), \
                recording(self.extensions, self.model, [len(r["prompt_ids"]) for r in requests], width) as cut:
            out = self.model.generate(
                input_ids=input_ids.to(device), attention_mask=attention.to(device),
                max_new_tokens=max(r["max_tokens"] for r in requests), **{k: v.to(device) for k, v in media.items()},
                do_sample=sample, temperature=temperature if sample else None, top_p=top_p if sample else None, top_k=0 if sample else None,
                pad_token_id=self.pad_id, eos_token_id=sorted(self.eos_ids), logits_processor=LogitsProcessorList([recorder]),
                return_dict_in_generate=True, synced_gpus=self.synced,
            )
        tokens = out.sequences[:, width:]
        logprobs = recorder.logprobs(tokens).cpu()
        tokens = tokens.cpu()
        # each row ends at its first EOS within its own max_tokens ("stop"), else at max_tokens ("length")
        limit = torch.tensor([r["max_tokens"] for r in requests]).clamp(max=tokens.shape[1])
        eos = torch.isin(tokens, torch.tensor(sorted(self.eos_ids))) & (torch.arange(tokens.shape[1]) < limit[:, None])
        stopped = eos.any(dim=1)
        lengths = torch.where(stopped, eos.int().argmax(dim=1) + 1, limit)
        results = [{"response_ids": ids[:n], "logprobs": lp[:n], "finish_reason": "stop" if stop else "length"}
                   for ids, lp, n, stop in zip(tokens.tolist(), logprobs.tolist(), lengths.tolist(), stopped.tolist())]
        for result, records in zip(results, cut(lengths.tolist())):
            if records:
                result["token_records"] = records
        return results

    def sleep(self) -> None:
        """Nothing to free: the HF engine's model and its per-batch cache live in host memory."""

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Nothing to restore (see :meth:`sleep`)."""

    def load_weights(self, state: dict[str, Any]) -> None:
        """Every weight of the model under its own names, except a VLM's frozen vision encoder (not sent)."""
        from rlhf.models.loading import check_synced_names

        check_synced_names(self.model, set(state))
        self.model.load_state_dict(state, strict=False)

    def max_weight_difference(self, state: dict[str, Any]) -> tuple[float, int]:
        return _max_difference(self.model.state_dict(), state)

    def sequence_logprobs(self, token_ids: list[int]) -> list[float]:
        import torch

        with torch.no_grad():
            logits = self.model(torch.tensor([token_ids], device=self.model.device)).logits[0, :-1].float().cpu()
        return torch.log_softmax(logits, -1).gather(-1, torch.tensor(token_ids[1:])[:, None])[:, 0].tolist()


class InProcessHFEngine(HFEngine):
    """HF ``generate`` inside each actor training rank, with the trained model itself (``--rollout.engine
    hf-inprocess``; ``auto`` with ``--vllm.num_engines 0`` unless AutoTP splits the actor's layers).

    Each rank generates its share of a batch. Sampling runs on a forked torch RNG, so the trainer's own
    random state (dropout, its shuffles) is the same as with an engine in another process.

    Where the training backend shards the parameters (``trained.sharded``: ZeRO-3, FSDP2) every forward
    all-gathers each layer from all ranks, so the ranks generate in step: each ``generate`` call runs with
    ``synced_gpus`` (a rank whose sequences ended keeps forwarding until every rank's have), and every rank
    makes as many calls as the rank with the most chunks (the others add one-token filler chunks). Gathering
    layer by layer, as the trainer's own forward does, keeps a rank's memory at its shards plus one layer,
    where gathering the whole model once per batch (TRL's default for ZeRO-3) would hold it whole on every rank;
    the price is a gather per layer per generated token.
    """

    in_training_rank = True
    shares_trained_weights = True  # generates with trained.module itself: nothing to reload after a step
    gathers_sharded_parameters = True  # by synced_gpus: the layers' own all-gathers, every rank in step

    @classmethod
    def auto_preference(cls, config: Any) -> int | None:
        return None if (config.vllm.num_engines or 0) > 0 else 20

    def __init__(self, model_path: str, param_dtype: str, max_model_len: int, seed: int, config: dict[str, Any]) -> None:
        """Nothing to load: the weights come with :meth:`attach`, the model extensions with :meth:`use_extensions`."""
        self.chunk_size = chunk_size(config)
        self.extensions: list[Any] = []

    def use_extensions(self, extensions: list[Any]) -> None:
        """Record with the rank's own model extensions (its worker built them as the model loaded): one set per rank,
        its hooks on the trained model once."""
        self.extensions = extensions

    def attach(self, trained: Any) -> None:
        """Generate with ``trained.module`` (the rank's :class:`rlhf.components.TrainedModel`), from now on."""
        import torch.distributed as dist

        self._use(trained.module)
        self.trained = trained
        ranks = dist.get_world_size() if dist.is_initialized() else 1
        self.synced = bool(getattr(trained, "sharded", False)) and ranks > 1

    def generate(self, requests: list[dict[str, Any]], temperature: float, top_p: float) -> list[dict[str, Any]]:
        """This rank's share; with sharded weights every rank calls it, an empty share too (the core does)."""
        import torch

        training = self.model.training
        self.model.eval()  # no dropout while sampling; the trainer sets its own mode before each phase
        try:
            device = self.model.device  # the trainer's generator on that device is restored too
            with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
                fillers = self._filler_chunks(len(requests))  # agreed before any chunk: the calls pair up in order
                results = super().generate(requests, temperature, top_p)
                for _ in range(fillers):
                    self._generate_chunk([{"prompt_ids": [self.pad_id], "max_tokens": 1, "seed": 0}], temperature, top_p)
                return results
        finally:
            self.model.train(training)

    def max_weight_difference(self, state: dict[str, Any]) -> tuple[float, int]:
        """As :meth:`HFEngine.max_weight_difference`, on the gathered weights (every rank calls it where they are sharded)."""
        with self.trained.gathered():  # parameters and buffers read directly: FSDP2's state_dict() would reshard them
            own = {name: value.detach() for name, value in [*self.model.named_parameters(), *self.model.named_buffers()]}
            return _max_difference(own, state)

    def _filler_chunks(self, count: int) -> int:
        """How many one-token chunks this rank adds so that every rank makes as many ``generate`` calls (0 unless synced)."""
        if not self.synced:
            return 0
        import torch
        import torch.distributed as dist

        chunks = -(-count // self.chunk_size)
        most = torch.tensor([chunks], device=self.model.device)  # on the model's device: NCCL takes no CPU tensor
        dist.all_reduce(most, op=dist.ReduceOp.MAX)
        return int(most.item()) - chunks


@contextlib.contextmanager
def policy_sampling(model: Any) -> Iterator[None]:
    """While ``generate`` runs, ``model`` carries a generation config of token ids only, so that it samples the policy
    itself at the run's temperature and top-p.

    A checkpoint's ``generation_config.json`` (``repetition_penalty``, ``no_repeat_ngram_size``, ``top_k``,
    ``min_length``…) would otherwise add its logits processors before :class:`SampledLogprobs` reads the row, and
    ``generate`` fills every argument left at transformers' default from the model's own config, so passing a fresh
    ``GenerationConfig`` is not enough: the model's is swapped for the call. The model's own is back afterwards (the
    trained model saves it with its weights). Under PEFT the config that counts is the base model's."""
    from transformers import GenerationConfig

    owner = model.get_base_model() if hasattr(model, "get_base_model") else model
    kept = owner.generation_config
    owner.generation_config = GenerationConfig(**{key: getattr(kept, key, None) for key in _TOKEN_KEYS})
    try:
        yield
    finally:
        owner.generation_config = kept


#: what the engines keep of a checkpoint's generation config: which ids begin, pad and end a sequence
_TOKEN_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id", "decoder_start_token_id")


def _max_difference(own: dict[str, Any], state: dict[str, Any]) -> tuple[float, int]:
    """The largest ``|own[name] - state[name]|`` over the names both hold, and how many those are."""
    shared = [k for k in state if k in own]
    return max((float((own[k].cpu() - state[k].to(own[k].dtype).cpu()).abs().max()) for k in shared), default=0.0), len(shared)
