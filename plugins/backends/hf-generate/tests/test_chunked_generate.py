"""The HF engines generate in chunks of ``--rollout.micro_batch_size`` and keep one step's log-probs at a time.

The oracle is the engine's former way: one ``generate`` call over every request with ``output_logits=True``
(every step's whole-vocabulary logits), the log-probs taken from those logits afterwards.
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

from rlhf_plugin_hf_generate.engine import HFEngine  # noqa: E402

#: prompts of different lengths (left padding) and max_tokens (a short row stops at its own limit)
REQUESTS = [{"prompt_ids": [5, 40, 41, 42], "max_tokens": 7, "seed": 11},
            {"prompt_ids": [6, 7], "max_tokens": 3, "seed": 12},
            {"prompt_ids": [9, 30, 31, 32, 33, 34], "max_tokens": 7, "seed": 13},
            {"prompt_ids": [8, 50, 51], "max_tokens": 5, "seed": 14},
            {"prompt_ids": [10], "max_tokens": 6, "seed": 15}]


def engine(path: Any, chunk: int) -> HFEngine:
    return HFEngine(str(path), "fp32", 128, 0, {"rollout": {"micro_batch_size": chunk}})


def every_logit_at_once(hf: HFEngine, requests: list[dict], temperature: float, top_p: float) -> list[dict]:
    """One call for all ``requests``, seeded by the first, the log-probs from ``output_logits`` (the oracle)."""
    width = max(len(r["prompt_ids"]) for r in requests)
    ids = torch.tensor([[hf.pad_id] * (width - len(r["prompt_ids"])) + r["prompt_ids"] for r in requests])
    torch.manual_seed(requests[0]["seed"])
    sample = temperature > 0
    out = hf.model.generate(input_ids=ids, attention_mask=(torch.arange(width) >= width - torch.tensor(
        [len(r["prompt_ids"]) for r in requests])[:, None]).long(), max_new_tokens=max(r["max_tokens"] for r in requests),
        do_sample=sample, temperature=temperature if sample else None, top_p=top_p if sample else None,
        top_k=0 if sample else None, pad_token_id=hf.pad_id, eos_token_id=sorted(hf.eos_ids), output_logits=True,
        return_dict_in_generate=True, suppress_tokens=hf.suppressed)
    tokens = out.sequences[:, width:]
    logprobs = torch.log_softmax(torch.stack(out.logits, 1).float() / (temperature if sample else 1.0), -1)
    logprobs = logprobs.gather(-1, tokens[..., None])[..., 0]
    return [{"response_ids": t[: r["max_tokens"]].tolist(), "logprobs": lp[: r["max_tokens"]].tolist()}
            for t, lp, r in zip(tokens, logprobs, requests)]


@pytest.mark.parametrize("temperature,top_p,suppress", [(1.0, 1.0, False), (0.7, 0.9, True), (0.0, 1.0, False)],
                         ids=["t1", "t0.7-top_p0.9-suppressed", "greedy"])
def test_one_chunk_samples_what_one_call_with_every_steps_logits_sampled(tiny_causal_lm_path, temperature, top_p,
                                                                          suppress) -> None:
    """A chunk covering every request: the same tokens, and log-probs to 1e-6, as the former single call; a
    suppressed token (a VLM's image placeholder) is never drawn and its probability stays in the log-probs."""
    hf = engine(tiny_causal_lm_path, chunk=len(REQUESTS))
    if suppress:  # the token the unsuppressed greedy step would choose first, so suppression changes the draw
        hf.suppressed = [every_logit_at_once(hf, REQUESTS[:1], 0.0, 1.0)[0]["response_ids"][0]]
    results = hf.generate(REQUESTS, temperature, top_p)
    expected = every_logit_at_once(hf, REQUESTS, temperature, top_p)
    for result, oracle in zip(results, expected):
        n = len(result["response_ids"])
        assert result["response_ids"] == oracle["response_ids"][:n]
        assert result["logprobs"] == pytest.approx(oracle["logprobs"][:n], abs=1e-6)
        if suppress:
            assert hf.suppressed[0] not in result["response_ids"]
    assert sum(len(r["response_ids"]) for r in results) > 2 * len(REQUESTS)  # the rows did sample several tokens


def test_chunks_hold_micro_batch_size_rows_and_their_logprobs_are_the_teacher_forced_ones(tiny_causal_lm_path) -> None:
    """Five requests in chunks of two: every forward holds at most two rows, each chunk is seeded by its first
    request (so a chunk's tokens do not depend on the other chunks), and every log-prob equals a teacher-forced
    forward of prompt + response at the sampling temperature."""
    hf = engine(tiny_causal_lm_path, chunk=2)
    rows: list[int] = []
    hook = hf.model.register_forward_pre_hook(lambda _, args, kwargs: rows.append(kwargs["input_ids"].shape[0]),
                                              with_kwargs=True)
    try:
        results = hf.generate(REQUESTS, 0.8, 1.0)
    finally:
        hook.remove()
    assert max(rows) == 2 and rows.count(1) >= 1  # chunks of 2, 2, 1
    assert results[2:4] == hf.generate(REQUESTS[2:4], 0.8, 1.0)  # the second chunk alone, seeded alike
    for request, result in zip(REQUESTS, results):
        assert 1 <= len(result["response_ids"]) <= request["max_tokens"]
        ids = request["prompt_ids"] + result["response_ids"]
        with torch.no_grad():
            logits = hf.model(torch.tensor([ids])).logits[0, len(request["prompt_ids"]) - 1 : -1] / 0.8
        forced = torch.log_softmax(logits, -1).gather(-1, torch.tensor(result["response_ids"])[:, None])[:, 0]
        assert result["logprobs"] == pytest.approx(forced.tolist(), abs=1e-5)
