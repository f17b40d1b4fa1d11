"""rlhf train dpo: DPO / cDPO / IPO against their formulas, and a run that moves the implicit rewards."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import torch
from rlhf_plugin_dpo.losses import dpo_loss, preference_margin
from rlhf_supervised.batch import collate_pairs, per_sample_sum, token_logprobs
from rlhf_supervised.config import PreferenceDataSection
from rlhf_supervised.conversations import preference_pair
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlhf.testing.cli import assert_ok, run_in_process, run_rlhf


def _log_sigmoid(x: float) -> float:
    return -math.log1p(math.exp(-x)) if x > 0 else x - math.log1p(math.exp(x))


@pytest.mark.parametrize("beta,eps", [(0.1, 0.0), (0.5, 0.2), (2.0, 0.05)])
def test_dpo_and_cdpo_match_the_formula(beta, eps) -> None:
    gen = torch.Generator().manual_seed(int(beta * 10))
    pc, pr, rc, rr = (torch.randn(32, generator=gen, dtype=torch.float64) * 20 for _ in range(4))
    z = preference_margin(pc, pr, rc, rr)
    expected = []
    for a, b, c, d in zip(pc.tolist(), pr.tolist(), rc.tolist(), rr.tolist()):
        zi = (a - b) - (c - d)
        expected.append(-(1 - eps) * _log_sigmoid(beta * zi) - eps * _log_sigmoid(-beta * zi))
    torch.testing.assert_close(dpo_loss(z, beta, eps), torch.tensor(expected, dtype=torch.float64))


def test_ipo_matches_the_formula_and_is_minimal_at_the_target_margin() -> None:
    beta = 0.25
    z = torch.linspace(-5, 5, 41, dtype=torch.float64)
    torch.testing.assert_close(dpo_loss(z, beta, ipo=True), (z - 2.0) ** 2)
    assert dpo_loss(torch.tensor([1 / (2 * beta)]), beta, ipo=True).item() == 0.0


def test_sequence_logprobs_of_pairs_are_summed_over_response_tokens_only(tiny_causal_lm_path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_causal_lm_path)
    model = AutoModelForCausalLM.from_pretrained(tiny_causal_lm_path, dtype=torch.float32).eval()
    data = PreferenceDataSection(input_template="Q: {}\nA: ", prompt_key="prompt")
    rows = [{"prompt": "2+2?", "chosen": "4", "rejected": "five or so"}, {"prompt": "1+9?", "chosen": "10", "rejected": "no"}]
    pairs = [preference_pair(r, data, tokenizer, "rows", i) for i, r in enumerate(rows)]
    for packed in (False, True):
        batch = collate_pairs(pairs, tokenizer.pad_token_id, packed)
        with torch.no_grad():
            sums = per_sample_sum(token_logprobs(model(**batch.model_inputs()).logits, batch), batch)
        for k, (side, index) in enumerate([("chosen", 0), ("chosen", 1), ("rejected", 0), ("rejected", 1)]):
            ids, mask = pairs[index][f"{side}_ids"], pairs[index][f"{side}_mask"]
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
            expected = sum(logp[t - 1, ids[t]].item() for t in range(1, len(ids)) if mask[t])
            assert sums[k].item() == pytest.approx(expected, abs=1e-4)


def write_pairs(path: Path, count: int) -> Path:
    rng = random.Random(0)
    with path.open("w") as handle:
        for _ in range(count):
            a, b = rng.randint(10, 99), rng.randint(10, 99)
            handle.write(json.dumps({"prompt": f"what is {a}+{b}?", "chosen": f"{a + b}", "rejected": "no idea"}) + "\n")
    return path


@pytest.mark.slow
@pytest.mark.parametrize(
    "variant,launcher",
    [([], ()), (["--model.ipo_enable"], ()), (["--model.label_smoothing", "0.1", "--model.nll_loss_coef", "0.2"], ()),
     ([], ("torch.distributed.run", "--standalone", "--nproc_per_node", "2"))],
    ids=["dpo", "ipo", "cdpo+nll", "dpo-2ranks"],
)
def test_dpo_training_separates_chosen_from_rejected(tmp_path, tiny_causal_lm_path, variant, launcher) -> None:
    """Each loss variant moves the margin up, reaches full accuracy and lowers its loss (cDPO+NLL logs its NLL
    term). The one-rank variants train in this process; ``dpo-2ranks`` is two real ranks under torchrun."""
    data = write_pairs(tmp_path / "pairs.jsonl", 32)
    out = tmp_path / "dpo"
    argv = ("train", "dpo", "--model.model_name_or_path", str(tiny_causal_lm_path),
            "--data.dataset", str(data), "--data.apply_chat_template", "--train.batch_size", "8",
            "--train.micro_batch_size", "4", "--adam.lr", "5e-4", "--ds.param_dtype", "fp32", "--ds.zero_stage", "2",
            "--ref.offload", "--ckpt.output_dir", str(out), *variant)
    assert_ok(run_rlhf(*argv, launcher=launcher) if launcher else run_in_process(*argv))
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["margin"] > metrics[0]["margin"] + 0.05
    assert metrics[-1]["acc"] == 1.0
    assert metrics[-1]["loss"] < metrics[0]["loss"]
    if "--model.nll_loss_coef" in variant:
        assert "nll_loss" in metrics[-1]
