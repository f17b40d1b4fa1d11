"""The systems that ``grpo_step.py`` times, each run as its own process.

    python benchmarks/grpo_workloads.py {rlhf,trl,raw-hf,raw-vllm} SPEC_JSON

``SPEC_JSON`` names the model, the prompt file, the sizes, the device (``cpu`` or ``cuda``) and the file where
the process appends one line per finished step: ``{"t": unix time, ...figures}``.
The parent reads that file, so start-up (process start → first step done) and
step time are measured the same way for every system, from outside.

- ``rlhf``: the real ``rlhf train ppo`` (a step-end observer plugin writes the lines).
- ``trl``: TRL's ``GRPOTrainer`` on the same model, prompts and reward (optional
  ``bench`` extra).
- ``raw-hf`` / ``raw-vllm``: the floor. The same generation with no framework (HF
  ``generate`` / an in-process vLLM ``LLM``), and a plain-torch GRPO update
  (forward, backward, AdamW step) of the same batch, in the same micro-batches as rlhf's
  (``spec["micro"]``); a line carries both times. The floor's process keeps freed host memory for reuse as rlhf's
  ranks do (``keep_freed_memory``; ``RLHF_KEEP_FREED_MEMORY=0`` switches both off).

On ``cuda`` every system trains in bf16 (rlhf: ``--ds.param_dtype bf16``; TRL and the floor: fp32 weights under
bf16 autocast, as TRL's ``bf16=True`` does) and a line also carries ``gpu_alloc``: the process's
``torch.cuda.max_memory_allocated()`` (0 where the model lives in another process, e.g. rlhf's Ray workers). rlhf's
run also records each rank's ``max_memory_allocated`` wherever the rank lives (``gpu_peaks/``) and saves ``rlhf
plan``'s JSON for the same flags (``plan.json``), for grpo_step.py's planned-against-measured lines.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

#: A step-end observer for the ``rlhf`` system: written to the work dir, passed with --plugins.
OBSERVER = '''"""benchmarks: one line per finished rlhf step."""
import json, os, sys, time
import rlhf

rlhf_plugin_api = rlhf.PLUGIN_API_VERSION


@rlhf.hookimpl
def rlhf_step_end(step, metrics):
    with open(os.environ["RLHF_BENCH_TIMES"], "a") as handle:
        handle.write(json.dumps({"t": time.time(), "response_length": metrics.get("response_length", 0.0),
                                 "generation": metrics.get("timing/generation", 0.0),
                                 "train": metrics.get("timing/ppo_train", 0.0),
                                 "sync": metrics.get("timing/broadcast", 0.0), "gpu_alloc": _gpu_alloc()}) + "\\n")


def _gpu_alloc():
    torch = sys.modules.get("torch")  # the ranks run in this process when they fit one (--train.in_process auto)
    return torch.cuda.max_memory_allocated() if torch is not None and torch.cuda.is_initialized() else 0


@rlhf.hookimpl
def rlhf_worker_init(role, rank, config):
    """Each rank on a GPU, in whichever process it lives (a Ray worker too): its max_memory_allocated every second,
    into RLHF_BENCH_GPU_PEAKS/<role>-<rank>.json (gpu_memory.rank_peaks reads it)."""
    import threading

    torch = sys.modules.get("torch")
    folder = os.environ.get("RLHF_BENCH_GPU_PEAKS")
    if not folder or torch is None or not torch.cuda.is_available():
        return
    path = os.path.join(folder, f"{role}-{rank}.json")

    def record():
        while True:
            with open(path + ".tmp", "w") as handle:
                json.dump({"role": role, "rank": rank, "max_memory_allocated": torch.cuda.max_memory_allocated()}, handle)
            os.replace(path + ".tmp", path)
            time.sleep(1)

    threading.Thread(target=record, name="gpu-peak", daemon=True).start()
'''


def exact_match(completions: list[str], labels: list[str]) -> list[float]:
    """The demo's reward: the response (without the EOS text) equals the sum."""
    return [float(c.replace("</s>", "").strip() == str(label)) for c, label in zip(completions, labels)]


def on_cuda(spec: dict[str, Any]) -> bool:
    return spec.get("device", "cpu") == "cuda"


def gpu_alloc(spec: dict[str, Any]) -> dict[str, int]:
    """This process's peak CUDA allocation so far, as a figure of its step line (nothing on CPU)."""
    import torch

    return {"gpu_alloc": torch.cuda.max_memory_allocated()} if on_cuda(spec) else {}


def record(spec: dict[str, Any], **figures: float) -> None:
    with open(spec["times"], "a") as handle:
        handle.write(json.dumps({"t": time.time(), **figures}) + "\n")


def run_rlhf(spec: dict[str, Any]) -> None:
    from rlhf_plugin_demo.run import rl_arguments

    run_dir = Path(spec["run_dir"])  # holds prompts.jsonl and reward.py (the driver writes them)
    observer = run_dir / "bench_observer.py"
    observer.write_text(OBSERVER)
    args = rl_arguments(run_dir, Path(spec["model"]), spec["steps"], 0, spec["engine"], prompts_per_step=spec["prompts"],
                        samples=spec["samples"], new_tokens=spec["new_tokens"], max_len=spec["max_len"])
    if on_cuda(spec):
        args[args.index("--ds.param_dtype") + 1] = "bf16"
    args += spec.get("rlhf_flags", [])
    env = {**os.environ, "RLHF_BENCH_TIMES": spec["times"], "RLHF_NO_PROGRESS": "1"}
    # `-m rlhf`, not the console script beside the interpreter: an install with pip --target (scripts/gpu_check.sh
    # --wheelhouse) puts that script elsewhere
    command = [sys.executable, "-m", "rlhf", "--plugins", str(observer), "train", "ppo", *args]
    if on_cuda(spec):  # each rank's allocator peak, and the plan of the same flags to set it against (gpu_memory.py)
        env["RLHF_BENCH_GPU_PEAKS"] = str(run_dir / "gpu_peaks")
        (run_dir / "gpu_peaks").mkdir(exist_ok=True)
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)
    if on_cuda(spec):
        plan = subprocess.run([sys.executable, "-m", "rlhf", "plan", "train", "ppo", *args, "--json"], env=env,
                              check=True, capture_output=True, text=True).stdout
        (run_dir / "plan.json").write_text(plan)


def run_trl(spec: dict[str, Any]) -> None:
    if not on_cuda(spec):
        os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    data = load_dataset("json", data_files=spec["prompt_file"], split="train").rename_column("input", "prompt")
    data = data.select(range(spec["prompts"] * spec["steps"]))

    step: dict[str, float] = {}  # what this step's generation took and produced, for its line

    def reward(prompts, completions, label, completion_ids, **kwargs):
        step["response_length"] = sum(map(len, completion_ids)) / len(completion_ids)
        return exact_match(completions, label)

    class TimedGRPOTrainer(GRPOTrainer):
        # the generation phase: TRL 1.16's rollout and scoring of a batch (the benchmark pins trl==1.16.0)
        def _generate_and_score_completions(self, inputs):
            started = time.perf_counter()
            try:
                return super()._generate_and_score_completions(inputs)
            finally:
                step["generation"] = step.get("generation", 0.0) + time.perf_counter() - started

    class StepTimes(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            step.clear()
            step["begin"] = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            train = time.perf_counter() - step.pop("begin") - step.get("generation", 0.0)
            record(spec, **step, train=train, **gpu_alloc(spec))

    samples = spec["prompts"] * spec["samples"]
    # on the GPU, rlhf's micro-batches (one optimizer step per rollout batch, accumulated); on CPU the whole batch at once
    micro = spec["micro"] if on_cuda(spec) else samples
    config = GRPOConfig(
        output_dir=str(Path(spec["run_dir"]) / "trl"), per_device_train_batch_size=micro, num_generations=spec["samples"],
        steps_per_generation=samples // micro, gradient_accumulation_steps=samples // micro, num_iterations=1,
        max_completion_length=spec["new_tokens"], learning_rate=1e-4, beta=0.0, temperature=1.0, top_p=1.0,
        loss_type="dapo", scale_rewards="group", max_steps=spec["steps"], use_cpu=not on_cuda(spec), bf16=on_cuda(spec),
        report_to="none", save_strategy="no", logging_steps=10**6, lr_scheduler_type="constant", seed=0,
        disable_tqdm=True, dataloader_num_workers=0,
    )
    trainer = TimedGRPOTrainer(model=AutoModelForCausalLM.from_pretrained(spec["model"]), reward_funcs=reward, args=config,
                          train_dataset=data, processing_class=AutoTokenizer.from_pretrained(spec["model"]),
                          callbacks=[StepTimes()])
    trainer.train()


def _prompt_ids(spec: dict[str, Any], tokenizer: Any) -> list[list[int]]:
    rows = [json.loads(line) for line in Path(spec["prompt_file"]).read_text().splitlines()]
    return [tokenizer(row["input"])["input_ids"] for row in rows]


def _grpo_update(model: Any, optimizer: Any, prompts: list[list[int]], responses: list[list[int]], pad_id: int,
                 micro: int, device: str) -> None:
    """One plain-torch GRPO update: token-mean clipped surrogate with random group-normalised advantages, in
    micro-batches of ``micro`` samples (rlhf's ``--train.micro_batch_size``), one optimizer step for the batch."""
    import torch

    seqs = [p + r for p, r in zip(prompts, responses)]
    tokens = sum(len(r) for r in responses)  # the step's token mean divides by every response token of the batch
    advantages = torch.randn(len(seqs), 1).to(device)
    optimizer.zero_grad(set_to_none=True)
    for start in range(0, len(seqs), micro):
        rows = range(start, min(start + micro, len(seqs)))
        width = max(len(seqs[i]) for i in rows)
        ids = torch.full((len(rows), width), pad_id)
        mask = torch.zeros((len(rows), width))
        for j, i in enumerate(rows):
            ids[j, : len(seqs[i])] = torch.tensor(seqs[i])
            mask[j, len(prompts[i]): len(seqs[i])] = 1.0
        ids, mask = ids.to(device), mask.to(device)
        with _autocast(device):
            logits = model(input_ids=ids, attention_mask=(mask > 0) | (ids != pad_id)).logits[:, :-1].float()
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
        ratio = torch.exp(logp - logp.detach())
        adv = advantages[start: start + len(rows)]
        target = mask[:, 1:]
        loss = -(torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv) * target).sum() / max(tokens, 1)
        loss.backward()
    optimizer.step()


def _autocast(device: str) -> Any:
    """bf16 autocast on the GPU (TRL's ``bf16=True``), nothing on CPU: the floor computes as the systems it floors."""
    import contextlib

    import torch

    return torch.autocast("cuda", dtype=torch.bfloat16) if device == "cuda" else contextlib.nullcontext()


def run_raw(spec: dict[str, Any], engine: str) -> None:
    """The floor: generation of the same requests, then one plain-torch update of the batch, under the host allocator
    settings of rlhf's ranks and engine processes (freed blocks kept for the next step: like with like)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlhf.runtime.cluster.host_memory import keep_freed_memory

    keep_freed_memory()
    if engine == "vllm":
        for key, value in {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                           "TORCHDYNAMO_DISABLE": "1", "VLLM_LOGGING_LEVEL": "ERROR"}.items():
            os.environ.setdefault(key, value)
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    prompt_ids = _prompt_ids(spec, tokenizer)
    device = spec.get("device", "cpu")
    model = AutoModelForCausalLM.from_pretrained(spec["model"], dtype=torch.float32).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    generate = _vllm_generator(spec) if engine == "vllm" else _hf_generator(model, tokenizer.pad_token_id,
                                                                          tokenizer.eos_token_id, device)
    n = spec["samples"]
    for step in range(spec["steps"]):
        batch = prompt_ids[step * spec["prompts"]: (step + 1) * spec["prompts"]]
        requests = [p for p in batch for _ in range(n)]
        started = time.perf_counter()
        responses = generate(requests, spec["new_tokens"], step)
        generated = time.perf_counter()
        model.train()
        _grpo_update(model, optimizer, requests, responses, tokenizer.pad_token_id, spec["micro"], device)
        if device == "cuda":
            torch.cuda.synchronize()  # the update's kernels are done before its time is taken
        record(spec, generation=generated - started, train=time.perf_counter() - generated,
               response_length=sum(map(len, responses)) / len(responses), **gpu_alloc(spec))


def _hf_generator(model: Any, pad_id: int, eos_id: int, device: str) -> Any:
    import torch

    def generate(requests: list[list[int]], new_tokens: int, seed: int) -> list[list[int]]:
        width = max(map(len, requests))
        ids = torch.full((len(requests), width), pad_id)
        attention = torch.zeros_like(ids)
        for i, p in enumerate(requests):
            ids[i, width - len(p):] = torch.tensor(p)
            attention[i, width - len(p):] = 1
        ids, attention = ids.to(device), attention.to(device)
        torch.manual_seed(seed)
        model.eval()
        with torch.no_grad(), _autocast(device):
            out = model.generate(input_ids=ids, attention_mask=attention, max_new_tokens=new_tokens, do_sample=True,
                                 temperature=1.0, top_k=0, top_p=1.0, pad_token_id=pad_id, eos_token_id=eos_id,
                                 output_logits=True, return_dict_in_generate=True)
        torch.log_softmax(torch.stack(out.logits, 1).float(), -1)  # the engines return log-probs too
        tokens = out.sequences[:, width:].tolist()
        return [row[: row.index(eos_id) + 1] if eos_id in row else row for row in tokens]

    return generate


def _vllm_generator(spec: dict[str, Any]) -> Any:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    # on the GPU in bf16, leaving most of the memory to the plain-torch update beside it
    gpu = {"dtype": "bfloat16", "gpu_memory_utilization": 0.3} if on_cuda(spec) else {"dtype": "float32"}
    llm = LLM(model=spec["model"], enforce_eager=True, max_model_len=spec["max_len"], seed=0,
              logprobs_mode="processed_logprobs", **gpu)

    def generate(requests: list[list[int]], new_tokens: int, seed: int) -> list[list[int]]:
        params = [SamplingParams(max_tokens=new_tokens, temperature=1.0, logprobs=0, seed=seed * 100003 + i)
                  for i in range(len(requests))]
        outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in requests], params, use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outputs]

    return generate


def main() -> None:
    system, spec = sys.argv[1], json.loads(sys.argv[2])
    if system == "rlhf":
        run_rlhf(spec)
    elif system == "trl":
        run_trl(spec)
    else:
        run_raw(spec, system.removeprefix("raw-"))


if __name__ == "__main__":
    main()
