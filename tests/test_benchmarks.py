"""The step-time benchmarks run end to end (2 steps of a system per code path); their figures are not asserted. Their
GPU modes run on a GPU machine (scripts/gpu_check.sh); here they refuse with one line."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_grpo_step_benchmark_smoke(tmp_path: Path) -> None:
    # rlhf's row of one engine covers the script's rlhf path (rlhf-vllm differs by one flag, and tests/test_rl_e2e.py
    # runs rlhf with vLLM); both raw engines, whose generation code differs, and the floor the rlhf row is set against.
    # A small batch (8 prompts x 4 samples): the code paths are the same, the figures are not asserted
    systems = "rlhf-hf,raw-vllm,raw-hf"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "grpo_step.py"), "--smoke", "--systems", systems,
                           "--prompts", "8", "--samples", "4", "--work", str(tmp_path), "--chart", str(tmp_path / "chart.png")],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for system in systems.split(","):  # one row each: wall s/step, CPU-s/step of its process tree, peak MiB, load
        row = re.search(rf"│ {system}\s+│ (\d+\.\d+)\s+│ (\d+\.\d+)\s+│ (\d+)\s+│ (\d+\.\d+)", done.stdout)
        assert row, (system, done.stdout)
        assert float(row[2]) > 0 and int(row[3]) > 100, row.group(0)  # some CPU, and at least a torch process's memory
    # the rlhf rows are set against the raw floor of the same engine (signed: "+12 %" or, faster, "-3 %")
    assert re.search(r"│ rlhf-hf .*[+-]\d+ %", done.stdout), done.stdout
    # --chart draws the figures and keeps them beside it, as the docs' chart is drawn
    saved = json.loads((tmp_path / "chart.json").read_text())
    assert "core" in saved["machine"] and [(s["prompts"], s["samples"]) for s in saved["shapes"]] == [(8, 4)]
    assert sorted(saved["shapes"][0]["systems"]) == sorted(systems.split(","))
    assert all(f["s_per_step"] > 0 and f["load"] for f in saved["shapes"][0]["systems"].values()), saved
    # --smoke compares like with like: a model that never emits EOS, so every system's responses reach the limit
    # (8 new tokens), and every system's training phase is timed
    assert saved["shapes"][0]["responses"] == "full"
    for system, figures in saved["shapes"][0]["systems"].items():
        assert figures["response_length"] == 8.0 and figures["phases"]["train"] > 0, (system, figures)
    assert (tmp_path / "chart.png").read_bytes().startswith(b"\x89PNG")


def test_a_grid_point_whose_systems_generated_different_lengths_is_refused() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from grpo_step import Run, length_mismatch
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))

    def runs(**lengths: list[float]) -> dict:
        return {system: [Run(1.0, [0.5], length) for length in values] for system, values in lengths.items()}

    # the mean of each system's runs is compared, the longest against the shortest
    assert length_mismatch(runs(trl=[100.0, 120.0], rlhf=[108.0]), 0.10) is None  # 110 against 108
    refused = length_mismatch(runs(trl=[100.0], rlhf=[111.0], raw=[105.0]), 0.10)
    assert refused is not None and "trl 100.0" in refused and "rlhf 111.0" in refused and "--responses full" in refused
    assert length_mismatch(runs(trl=[100.0], rlhf=[111.0]), 0.12) is None


def test_a_run_whose_later_steps_fault_their_training_memory_in_again_fails_the_benchmark() -> None:
    """Issue 70's guard: rlhf's ranks and the floor keep what they free, so a training phase after step 1 finds its
    memory resident; one that faults in more than 10 % of step 1's pages (and over the floor) is named. TRL keeps
    glibc's defaults and is not judged."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        from grpo_step import Run
        from training_faults import FAULT_FLOOR, fault_regressions
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))

    def run(*faults: int) -> Run:
        return Run(1.0, [0.5], 8.0, train_faults=list(faults), train_kernel=[0.1] * len(faults),
                   train_faulters=["python (7)"] * len(faults))

    assert fault_regressions({"rlhf-vllm": [run(400_000, 900, 30_000)], "trl": [run(400_000, 400_000)]}) == []
    (found,) = fault_regressions({"rlhf-vllm": [run(400_000, 900)], "rlhf-hf": [run(400_000, 900, 350_000)]})
    assert found.startswith("rlhf-hf repeat 1 faulted its training memory in again in a steady step") and \
        "step 3 350,000 (python (7))" in found and "step 2" not in found
    assert fault_regressions({"raw-hf": [run(FAULT_FLOOR, FAULT_FLOOR)]}) == []  # a small step 1 is no yardstick
    assert fault_regressions({"raw-hf": [run(1000, FAULT_FLOOR + 1)]}) != []
    # the warm-up steps, left out of the table's medians, may still grow the heap; the steady ones may not
    assert fault_regressions({"rlhf-hf": [run(400_000, 150_000, 140_000, 20)]}, warmup=2) == []
    assert fault_regressions({"rlhf-hf": [run(400_000, 150_000, 140_000, 90_000)]}, warmup=2) != []


def test_the_step_chart_redraws_from_a_saved_results_file(tmp_path: Path) -> None:
    """The docs' chart comes from the committed results, without running the benchmark."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "step_chart.py"),
                           str(ROOT / "benchmarks" / "results" / "grpo_step_grid_cpu.json"), str(tmp_path / "chart.png")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(tmp_path / "chart.png").shape
    assert (width, height) == (800, 450)  # 8 x 4.5 inches at 100 dpi


@pytest.mark.slow
def test_async_pipeline_benchmark_smoke(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "async_pipeline.py"), "--smoke", "--engine", "hf",
                           "--work", str(tmp_path)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for mode in ("off", "on"):  # a row each: steps, seconds per step, rewards, staleness
        assert re.search(rf"^{mode}\s+2\s+\d+\.\d+\s+\d\.\d+\s+\d\.\d+\s+\d\.\d+$", done.stdout, re.MULTILINE), done.stdout
    assert (tmp_path / "async_reward_curves.png").is_file()


@pytest.mark.skipif(importlib.util.find_spec("torch") is None or __import__("torch").cuda.is_available(),
                    reason="the error of a machine without a CUDA GPU")
@pytest.mark.parametrize("script", ["grpo_step.py --device cuda", "deepcompile.py"])
def test_a_gpu_benchmark_on_a_machine_without_a_gpu_is_one_error_line(script: str) -> None:
    name, *args = script.split()
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / name), *args], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 2
    assert done.stdout == "" and len(done.stderr.splitlines()) == 1, done.stderr
    assert done.stderr.startswith(f"{name}: error: ") and "sees no CUDA GPU" in done.stderr


def test_the_step_chart_draws_each_kind_of_response_length_in_a_panel_of_its_own(tmp_path: Path) -> None:
    def shape(responses: str, seconds: float) -> dict:
        return {"prompts": 8, "samples": 8, "new_tokens": 8, "responses": responses,
                "systems": {"trl": {"s_per_step": seconds, "load": [1.0]}}}

    document = {"machine": "2-core test", "date": "2026-11-28", "shapes": [shape("early", 0.5), shape("full", 1.5)]}
    (tmp_path / "grid.json").write_text(json.dumps(document))
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "step_chart.py"), str(tmp_path / "grid.json"),
                           str(tmp_path / "chart.png")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(tmp_path / "chart.png").shape
    assert (width, height) == (1600, 450)  # two 8 x 4.5 inch panels side by side


def benchmark_module(name: str):
    """A module of benchmarks/ (they import each other as scripts do, from their own folder)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_the_gpu_check_sets_each_ranks_allocator_peak_against_the_plan_of_its_gpu(tmp_path: Path, capsys) -> None:
    """scripts/gpu_check.sh's planned-against-measured lines: each rank's recorded max_memory_allocated (the files
    grpo_workloads.py's observer writes on a GPU) beside `rlhf plan --json`'s peak of the GPU that holds it."""
    import random

    from rlhf.cli.main import main

    gpu_memory = benchmark_module("gpu_memory")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 896, "intermediate_size": 4864,
        "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2, "vocab_size": 151936,
        "max_position_embeddings": 512, "tie_word_embeddings": True}))
    # GRPO on Qwen2.5-0.5B's shape: two ZeRO-3 ranks and an HF engine process, one GPU each
    assert main(["plan", "train", "ppo", "--actor.model_name_or_path", str(model), "--ds.zero_stage", "3",
                 "--actor.num_gpus_per_node", "2", "--vllm.num_engines", "0", "--algo.advantage.estimator", "group_norm",
                 "--rollout.n_samples_per_prompt", "4", "--rollout.batch_size", "8", "--algo.kl.init_coef", "0",
                 "--data.max_len", "512", "--plan.gpus", "3", "--plan.gpu_memory", "80GiB", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    rng = random.Random(0)
    peaks = tmp_path / "gpu_peaks"
    peaks.mkdir()
    measured = {rank: rng.randrange(2**30, 8 * 2**30) for rank in (0, 1)}
    for rank, nbytes in measured.items():
        (peaks / f"actor-{rank}.json").write_text(json.dumps({"role": "actor", "rank": rank,
                                                               "max_memory_allocated": nbytes}))
    (peaks / "ref-0.json").write_text(json.dumps({"role": "ref", "rank": 0, "max_memory_allocated": 2**30}))

    lines = gpu_memory.planned_against_measured(plan, gpu_memory.rank_peaks(peaks))

    assert len(lines) == 3
    for rank, nbytes in measured.items():
        gpu = next(g for g in plan["gpus"] if f"actor rank {rank}" in g["holds"])
        line = next(line for line in lines if line.startswith(f"actor rank {rank} "))
        assert f"planned {gpu['peak'] / 2**30:.2f} GiB, measured {nbytes / 2**30:.2f} GiB" in line, line
        assert line.endswith(f"plan {100 * (gpu['peak'] - nbytes) / nbytes:+.0f} %"), line
    assert "ref rank 0: measured 1.00 GiB; the plan places no such rank" in lines  # a run without a reference model


def test_memory_scaling_calls_a_peak_flat_within_the_stored_rollouts_plus_a_tenth() -> None:
    """From the fewest prompts to the most, a process's peak may grow by the stored rollouts' growth plus 10 % of its
    smaller peak; more is a verdict of GROWS, naming the engine, backend, setting and process."""
    scaling = benchmark_module("memory_report")
    mib = scaling.MiB

    def point(prompts: int, rank: int, engine: int = 0, **kw) -> object:
        return scaling.Point("hf", "zero3", prompts, True, rank_peak=rank * mib, engine_peak=engine * mib,
                             stored_rollouts=prompts * mib // 8, **kw)

    # 8 -> 128 prompts: the rollouts grow by 15 MiB, so 1000 MiB may reach 1000 + 15 + 100
    flat = scaling.growth_verdicts([point(8, 1000, 500), point(32, 1050, 520), point(128, 1115, 565)])
    assert flat == ["hf zero3 keep on rank: 1000 -> 1115 MiB (8 -> 128 prompts, +115 MiB; allowed +115): flat",
                    "hf zero3 keep on engine: 500 -> 565 MiB (8 -> 128 prompts, +65 MiB; allowed +65): flat"]
    grows = scaling.growth_verdicts([point(8, 1000), point(128, 1116), point(32, 900, error="refused")])
    assert grows == ["hf zero3 keep on rank: 1000 -> 1116 MiB (8 -> 128 prompts, +116 MiB; allowed +115): GROWS"]
    assert scaling.growth_verdicts([point(8, 1000), point(32, 1000, error="refused")]) == []  # one point: no verdict


@pytest.mark.slow
def test_memory_scaling_benchmark_smoke(tmp_path: Path) -> None:
    """One point end to end: an rlhf run's rank found by its worker-init hook, each step's peak, the plan beside it."""
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "memory_scaling.py"), "--smoke", "--work",
                           str(tmp_path), "--results", str(tmp_path / "points.json"), "--chart",
                           str(tmp_path / "chart.png")], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    [point] = json.loads((tmp_path / "points.json").read_text())["points"]
    assert (point["engine"], point["backend"], point["prompts"], point["keep"]) == ("hf", "zero3", 8, True)
    # the rank holds a 151,936 x 64 embedding with its gradient and Adam's moments (39 MB each) above its libraries
    assert point["rank_peak"] - point["rank_before_model"] > 4 * 39 * 10**6, point
    assert len(point["rank_step_peaks"]) == 2 and point["rank_peak"] == max(point["rank_step_peaks"])
    assert point["engine_peak"] > 39 * 10**6 and point["planned_rank"] > 0 and point["planned_engine"] > 0, point
    assert len(point["losses"]) == 2 and all(abs(loss) < 10 for loss in point["losses"])
    assert (tmp_path / "chart.png").read_bytes().startswith(b"\x89PNG")
