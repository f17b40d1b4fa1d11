"""A checkpoint's ``generation_config.json`` leaves the policy sampled: published chat models ship penalties, top-k and
a temperature of their own, which ``generate`` would apply before the engine records its log-probs (issue 65)."""

from __future__ import annotations

from pathlib import Path

import pytest
from rlhf_test_support import TIGHT_CORRECTION, base_flags, grpo_flags

from rlhf.cli.main import main
from rlhf.models.loading import checkpoint_sampling_defaults
from rlhf.records.metrics import read_metrics
from rlhf.testing.conformance.backends import CHECKPOINT_SAMPLING_DEFAULTS, with_sampling_defaults


def test_the_sampling_defaults_a_checkpoint_ships_are_read_without_the_neutral_ones(tmp_path: Path) -> None:
    (tmp_path / "generation_config.json").write_text(
        '{"bos_token_id": 1, "eos_token_id": [2, 7], "do_sample": true, "temperature": 0.7, "top_p": 1.0, "top_k": 20,'
        ' "repetition_penalty": 1.05, "max_new_tokens": 2048, "transformers_version": "4.51.0", "bad_words_ids": []}')
    assert checkpoint_sampling_defaults(str(tmp_path)) == {"temperature": 0.7, "top_k": 20, "repetition_penalty": 1.05}
    (tmp_path / "generation_config.json").write_text("[1, 2]")
    assert checkpoint_sampling_defaults(str(tmp_path)) == {}
    assert checkpoint_sampling_defaults(str(tmp_path / "missing")) == {}


@pytest.mark.slow
def test_grpo_through_the_in_rank_hf_engine_samples_the_policy_whatever_the_checkpoint_sets(
        task_files, tiny_causal_lm_path, tmp_path, capsys) -> None:
    """The actor's ``generation_config.json`` sets a repetition penalty, no-repeat n-grams, top-k 1, a temperature,
    top-p and 190 suppressed tokens; the in-rank HF engine (``--vllm.num_engines 0``) samples at the run's temperature
    all the same: every token's log-prob is the trainer's to 1e-3 (none masked by the tight correction), and one
    console line names what was ignored. Before the engine ignored them, the penalties moved the recorded log-probs."""
    with with_sampling_defaults(tiny_causal_lm_path) as model:
        flags = [*base_flags(model, task_files["prompts"], tmp_path, "hf", steps=2), *grpo_flags(task_files["reward"]),
                 *TIGHT_CORRECTION]
        assert main(["train", "ppo", *flags]) == 0
    metrics = read_metrics(tmp_path / "out")
    assert len(metrics) == 2
    for step in metrics:
        assert step["is_filter_ratio"] == 0.0 and abs(step["vllm_kl"]) < 1e-5
    shown = [line for line in capsys.readouterr().err.splitlines() if "generation_config.json sets" in line]
    assert len(shown) == 1
    for key, value in CHECKPOINT_SAMPLING_DEFAULTS.items():
        assert (f"{key}={value}" in shown[0]) is (key != "do_sample"), key
    assert "--rollout.temperature 1" in shown[0]
