"""docs/plan.md prints real plans: its quick start's every part, note, phase and total, its SFT example's verdict and
the issue-57 table's fullest GPUs are what ``rlhf plan`` gives for the commands it shows (issue 69: docs that cannot
drift)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

from rlhf.cli.main import main
from rlhf.planning import format_bytes

DOC = Path(__file__).resolve().parents[1] / "docs" / "plan.md"
BENCHMARK_CONFIGS = Path(__file__).resolve().parents[1] / "benchmarks" / "configs"
#: Llama-3-8B's published architecture (its config.json), which the quick start is planned from
LLAMA3_8B = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 4096,
             "intermediate_size": 14336, "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
             "vocab_size": 128256, "max_position_embeddings": 8192, "rope_theta": 500000.0, "tie_word_embeddings": False}


def printed(after: str) -> list[str]:
    """The lines of the first fenced block after the line ``after`` of docs/plan.md."""
    text = DOC.read_text()
    block = text[text.index(after):].split("```", 2)[1]
    return block.strip("\n").splitlines()


def command(lines: list[str]) -> list[str]:
    """The ``$ rlhf plan …`` command of a block, its continuation lines joined, without ``rlhf plan``."""
    start = next(i for i, line in enumerate(lines) if line.removeprefix("$ ").startswith("rlhf plan "))
    joined = ""
    for line in lines[start:]:
        joined += line.rstrip("\\").strip() + " "
        if not line.endswith("\\"):
            break
    return shlex.split(joined.removeprefix("$ "))[2:]


def plan_json(capsys, argv: list[str]) -> dict:
    main(["plan", *argv, "--json"])
    return json.loads(capsys.readouterr().out)


def squeezed(line: str) -> str:
    return " ".join(line.split())


def test_the_quick_start_prints_what_rlhf_plan_gives(capsys, tmp_path: Path) -> None:
    lines = printed("## What it prints")
    model = tmp_path / "llama3-8b"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(LLAMA3_8B))
    argv = [str(model) if arg == "llama3-8b" else arg for arg in command(lines)]
    out = plan_json(capsys, argv)
    rows = [squeezed(f"{group} {p['part']} {format_bytes(p['bytes'])} {' '.join(p['away_in'])} {p['note']}")
            for group, parts in out["parts"].items() for p in parts]
    shown = [squeezed(line) for line in lines[lines.index("Memory per GPU") + 2:lines.index("Total per GPU")]]
    assert shown == rows
    gpus = {(gpu["generate"], gpu["train"], gpu["peak"]) for gpu in out["gpus"]}
    assert len(gpus) == 1  # every GPU holds the same: the doc prints them as one row
    (generate, train, peak), = gpus
    assert squeezed(lines[-2]) == f"0 0-{len(out['gpus']) - 1} {format_bytes(generate)} {format_bytes(train)} " \
        f"{format_bytes(peak)}"
    assert lines[-1] == f"verdict: {out['verdict']}"


def test_the_sft_pair_example_prints_the_verdict_rlhf_plan_gives(capsys) -> None:
    lines = printed("needs a pair")
    argv = [str(BENCHMARK_CONFIGS / "llama-2-7b") if arg.endswith("configs/llama-2-7b") else arg for arg in command(lines)]
    out = plan_json(capsys, argv)
    start = next(i for i, line in enumerate(lines) if line.startswith("verdict:"))  # wrapped over lines
    assert squeezed(" ".join(lines[start:])) == f"verdict: {out['verdict']}"
    numbers = re.findall(r"needs ([\d.]+ GiB), with Adam on the CPU alone ([\d.]+ GiB), with both ([\d.]+ GiB)",
                         DOC.read_text())[0]
    peaks = [format_bytes(plan_json(capsys, [*argv, *change])["gpus"][0]["peak"])
             for change in (["--ds.zero_stage", "3"], ["--ds.adam_offload"], ["--ds.zero_stage", "3", "--ds.adam_offload"])]
    assert list(numbers) == peaks


def test_the_issue_57_table_holds_what_rlhf_plan_gives(capsys) -> None:
    """Each published config's verdict and fullest GPU, the same in generate and train as the table's header says."""
    argv = command(printed("The four published configs"))
    text = DOC.read_text()
    rows = re.findall(r"^\| ([\w.-]+) \| (fits|does not fit) \| ([\d.]+ GiB)", text[text.index("| MODEL |"):], re.M)
    assert [row[0] for row in rows] == ["qwen2.5-0.5b", "qwen2.5-7b", "llama-2-7b", "qwen3-30b-a3b"]
    for name, verdict, fullest in rows:
        out = plan_json(capsys, [arg.replace("benchmarks/configs/MODEL", str(BENCHMARK_CONFIGS / name)) for arg in argv])
        assert out["verdict"].startswith(verdict + ":"), (name, out["verdict"])
        gpu = max(out["gpus"], key=lambda g: g["peak"])
        assert gpu["generate"] == gpu["train"] and format_bytes(gpu["peak"]) == fullest, (name, gpu)
