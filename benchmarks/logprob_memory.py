"""Peak memory of the actor's log-prob/entropy step at a 152k vocabulary: the direct formulas against
``rlhf.ops.chunked_logprobs`` (issue 57 item 3).

    python benchmarks/logprob_memory.py                       # 4 × 512 tokens, bf16 and fp32 models
    python benchmarks/logprob_memory.py --tokens 2048 --dtypes bfloat16

A Qwen2-shaped model with Qwen2's 152,064-token vocabulary and a tiny body (hidden 64, 2 layers, untied
head), one micro-batch of 4 samples (a 64-token prompt and responses of different lengths, so there is
padding), temperature 0.7, and the actor's step as PolicyWorker.train runs it: forward, log-probs and
entropy of the action tokens, a PPO-like token-mean loss minus 0.01 × entropy, backward. ``direct`` is
the code the worker had before (``action_logits(...).float() / τ``, ``log_softmax``, ``gather``,
``token_entropy``); ``chunked`` is ``rlhf.runtime.workers.batch.action_logprobs``. Each path runs in a
fresh process; the peak is ``ru_maxrss`` (the CPU allocator returns large blocks to the OS at once,
so the resident maximum is the step's live maximum), reported whole and above the resident size just
before the forward. ``logprobs`` is the reference's/actor's no-grad forward the same way. The losses and
every parameter's gradient (``logprobs``: every log-prob) of the two paths are compared.

A benchmark, not a test: figures move with the machine's load (printed beside them).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from pathlib import Path

VOCAB, PROMPT, SAMPLES, TEMPERATURE = 152_064, 64, 4, 0.7


def resident_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def run_path(path: str, phase: str, dtype_name: str, tokens: int, chunk: int, out: Path) -> dict:
    """One measurement, in this (fresh) process."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    import rlhf.ops
    from rlhf.ops import aggregate_loss, token_entropy
    from rlhf.runtime.workers.batch import action_logprobs, pack

    rlhf.ops.LOGPROB_CHUNK_TOKENS = chunk  # read at each call

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    model = Qwen2ForCausalLM(config).to(getattr(torch, dtype_name))
    gen = torch.Generator().manual_seed(1)
    responses = [int((tokens - PROMPT) * share) for share in (1.0, 0.9, 0.7, 1.0)][:SAMPLES]
    batch = pack([torch.randint(0, VOCAB, (PROMPT,), generator=gen).tolist() for _ in responses],
                 [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in responses], pad_id=0)
    advantages = torch.randn(batch.actions.shape, generator=gen)
    mask = batch.action_mask

    def logprobs_and_entropy(logits):
        if path == "chunked":
            return action_logprobs(logits, batch, TEMPERATURE, with_entropy=True)
        scaled = batch.at_actions(logits).float() / TEMPERATURE  # the worker's code before chunked_logprobs
        logp = torch.log_softmax(scaled, -1).gather(-1, batch.actions.unsqueeze(-1)).squeeze(-1) * mask
        return logp, token_entropy(scaled)

    before = resident_bytes()
    if phase == "logprobs":
        with torch.no_grad():
            logp, _ = logprobs_and_entropy(model(**batch.model_inputs()).logits)
        loss = logp.sum()
        torch.save({"log-probs": logp}, out)
    else:
        logp, entropy = logprobs_and_entropy(model(**batch.model_inputs()).logits)
        ratio = torch.exp(logp - logp.detach())
        loss = (aggregate_loss(-ratio * advantages, mask, "token-mean")
                - 0.01 * aggregate_loss(entropy, mask, "token-mean"))
        loss.backward()
        torch.save({name: p.grad for name, p in model.named_parameters()}, out)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"loss": float(loss.detach()), "peak": peak, "step_peak": peak - before}


def measure(phase: str, dtype: str, tokens: int, chunk: int) -> dict:
    import torch

    results = {}
    with tempfile.TemporaryDirectory() as scratch:
        for path in ("direct", "chunked"):
            grads = Path(scratch) / f"{path}.pt"
            line = subprocess.run([sys.executable, __file__, "--child", path, phase, dtype, str(tokens), str(chunk), str(grads)],
                                  check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
            results[path] = json.loads(line)
        direct, chunked = (torch.load(Path(scratch) / f"{p}.pt") for p in ("direct", "chunked"))
        results["max_difference"] = max(float((direct[k].float() - chunked[k].float()).abs().max()) for k in direct)
    results["loss_difference"] = abs(results["direct"]["loss"] - results["chunked"]["loss"])
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=512, help="tokens per sample (prompt + longest response)")
    parser.add_argument("--dtypes", default="bfloat16,float32")
    parser.add_argument("--phases", default="train,logprobs")
    parser.add_argument("--chunk", type=int, default=None, help="LOGPROB_CHUNK_TOKENS for this run (default: rlhf's)")
    parser.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        path, phase, dtype, tokens, chunk, out = args.child
        print(json.dumps(run_path(path, phase, dtype, int(tokens), int(chunk), Path(out))))
        return
    from rlhf.ops import LOGPROB_CHUNK_TOKENS

    chunk = args.chunk or LOGPROB_CHUNK_TOKENS
    gib = 2**30
    for dtype in args.dtypes.split(","):
        for phase in args.phases.split(","):
            load = os.getloadavg()[0]
            r = measure(phase, dtype, args.tokens, chunk)
            d, c = r["direct"], r["chunked"]
            compared = "every gradient" if phase == "train" else "every log-prob"
            print(f"{dtype:8} {phase:8} {SAMPLES}×{args.tokens}, chunk {chunk}: peak {d['peak'] / gib:.2f} -> {c['peak'] / gib:.2f} GiB, "
                  f"above the loaded model {d['step_peak'] / gib:.2f} -> {c['step_peak'] / gib:.2f} GiB "
                  f"({d['step_peak'] / max(c['step_peak'], 1):.1f}× less); |Δloss| {r['loss_difference']:.2e}, "
                  f"{compared} to {r['max_difference']:.2e} "
                  f"(load {load:.1f})", flush=True)


if __name__ == "__main__":
    main()
