"""Seconds per GRPO step: rlhf (vLLM and HF engines) against TRL and the raw engines.

    python benchmarks/grpo_step.py                 # the table (2 repeats, interleaved)
    python benchmarks/grpo_step.py --grid          # prompts/step 8/32/128 x new tokens 8/32/128
    python benchmarks/grpo_step.py --smoke         # 2 steps of each system (CI runs this)
    python benchmarks/grpo_step.py --grid --results benchmarks/results/grpo_step_grid_cpu.json \
        --chart docs/images/grpo_step_time.png     # the grid, saved and drawn as the docs' chart
    python benchmarks/grpo_step.py --device cuda   # one CUDA GPU: rlhf, TRL and the floor on a 0.5B-shaped model

The task is the demo's: 2-digit addition, a briefly supervised ~0.4 M-parameter Llama,
32 prompts x 8 samples per step, 8 new tokens, exact-match reward, one optimizer step
per rollout batch, no KL, lr 1e-4. Every system runs as a fresh process
(benchmarks/grpo_workloads.py), the systems alternate within each repeat, and each
process appends a line per finished step, so start-up (process start to first step
done) and step time are measured from outside, the same way for all.

Beside the wall clock, each run's whole process tree (Ray's processes and workers included) is
sampled from /proc: CPU-seconds per steady step and peak resident memory
(benchmarks/process_tree.py), and the minor page faults and kernel time of each step's training phase: rlhf's
ranks and the floor keep the host memory they free (rlhf.runtime.cluster.host_memory), so a step after the first
that faults its memory in again (more than 10 % of step 1's faults) fails the benchmark, in every layout. Before each run the script waits for the 1-minute load to fall
under ``--quiet_load`` (at most ``--quiet_wait`` seconds) and prints the load beside the figures,
with ``!`` where the machine never got quiet.

- ``rlhf-vllm-ray`` is ``rlhf-vllm`` with every rank in a Ray worker (``--train.in_process off``), the layout a GPU
  cluster gets; on a CPU cluster ``rlhf-vllm`` keeps the ranks in the controller's process.
- ``rlhf-hf`` is ``--vllm.num_engines 0``: HF generate inside the actor's rank (``hf-inprocess``);
  ``rlhf-hf-actor`` puts it in an engine process of its own (``--rollout.engine hf``). ``rlhf-vllm``
  is one vLLM engine in its own process, ``rlhf-vllm-inproc`` vLLM inside the actor's rank.
- ``raw-hf``/``raw-vllm`` are the floor: the same generation with no framework, plus a
  plain-torch forward/backward/AdamW step of the batch in rlhf's micro-batches (their step =
  those two times), under the host allocator settings of rlhf's ranks (freed memory kept for the next step).
- ``trl`` needs TRL (``pip install -c constraints.txt -e '.[bench]'``); it is left out, with a note, if absent.

``--device cuda`` runs the same systems on one GPU, in bf16, on a random Llama of Qwen2.5-0.5B's shape (hidden
896, 24 layers; ``--model_shape demo`` for the tiny one) with the demo's tokenizer, prompts and reward: by default
rlhf's in-rank HF engine, TRL and the HF floor, 64 prompts x 8 samples, 64 new tokens. Two more columns: the
GPU's memory at its peak above what was used before the run (nvidia-smi, every process of the run) and the
peak that torch's allocator saw in the system's own process (``-`` where the model lives in another process).

A benchmark, not a test: figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpu_memory import GpuMemory, device_name, planned_against_measured, rank_peaks  # beside this script (on sys.path)
from process_tree import TreeSampler, load_average, wait_for_quiet
from step_chart import cpu_machine, save, shape_record
from training_faults import FAULT_SHARE, fault_regressions, training_faults

HERE = Path(__file__).resolve().parent
#: system -> (workload of grpo_workloads.py, rollout engine family, extra `rlhf train ppo` flags)
SYSTEMS: dict[str, tuple[str, str, tuple[str, ...]]] = {
    "rlhf-vllm": ("rlhf", "vllm", ()),  # --vllm.num_engines 1: a vLLM engine in its own process
    # the GPU layout on any machine: the ranks in Ray workers beside the engine process (on a CPU cluster they
    # otherwise share the controller's process)
    "rlhf-vllm-ray": ("rlhf", "vllm", ("--train.in_process", "off")),
    "rlhf-vllm-inproc": ("rlhf", "vllm", ("--rollout.engine", "vllm-inprocess")),  # vLLM inside the actor's rank
    "rlhf-hf": ("rlhf", "hf", ()),  # --vllm.num_engines 0: HF generate inside the actor's rank (hf-inprocess)
    "rlhf-hf-actor": ("rlhf", "hf", ("--rollout.engine", "hf")),  # HF generate in an engine process of its own
    "trl": ("trl", "hf", ()),
    "raw-vllm": ("raw-vllm", "vllm", ()),
    "raw-hf": ("raw-hf", "hf", ()),
}
#: the phases of a step that a system's lines may time (grpo_workloads.py), in the table's order
PHASES = ("generation", "train", "sync")
DEFAULT_SYSTEMS = ("rlhf-vllm", "rlhf-vllm-inproc", "rlhf-hf", "trl", "raw-vllm", "raw-hf")
DEFAULT_GPU_SYSTEMS = ("rlhf-hf", "trl", "raw-hf")  # vLLM is often absent from a GPU image; name its rows to add them
#: --model_shape -> the LlamaConfig sizes of the random model (``demo``: the demo's own ~0.4 M-parameter Llama)
SHAPES: dict[str, dict[str, int]] = {
    "demo": {},
    "0.5b": {"hidden_size": 896, "intermediate_size": 4864, "num_hidden_layers": 24, "num_attention_heads": 14,
             "num_key_value_heads": 2},  # Qwen2.5-0.5B's shape
}


@dataclass
class Run:
    """What one process of one system produced."""

    startup: float  # process start -> first step done, seconds
    steps: list[float]  # seconds of every step after the first
    response_length: float
    phases: dict[str, float] = field(default_factory=dict)  # median seconds per phase, where the system reports them
    cpu_per_step: float = float("nan")  # CPU-seconds of the whole process tree per steady step
    peak_rss: int = 0  # bytes, the whole process tree at its largest
    load: float = 0.0  # the machine's 1-minute load, the higher of the run's start and end
    quiet: bool = True  # whether the load was under --quiet_load when the run started
    gpu_peak: int = 0  # bytes, the GPU's memory.used at its peak above the run's start (--device cuda)
    gpu_alloc: int = 0  # bytes, torch.cuda.max_memory_allocated() of the system's own process, 0 where unknown
    plan_lines: list[str] = field(default_factory=list)  # rlhf on cuda: each rank's planned against measured peak
    #: per step, step 1 first: the minor page faults and system CPU-seconds of the whole process tree during the
    #: training phase, and the process that faulted most there (empty where the system does not time that phase: TRL)
    train_faults: list[int] = field(default_factory=list)
    train_kernel: list[float] = field(default_factory=list)
    train_faulters: list[str] = field(default_factory=list)


def prepare(work: Path, max_positions: int, warm_start: bool, shape: str = "demo", full_length: bool = False) -> Path:
    """The model every system starts from: the demo's tokenizer and Llama (supervised until 30 % greedy accuracy
    when ``warm_start``), or a random Llama of another ``shape`` (SHAPES) with the same tokenizer.

    ``full_length``: a random model that never emits EOS (:func:`never_ends`), so that every system's responses run
    to the token limit and the systems compare on the same work."""
    from rlhf_plugin_demo import task

    name = f"model-{max_positions}" if shape == "demo" else f"model-{shape}-{max_positions}"
    model_dir = work / (f"{name}-full" if full_length else name)
    if (model_dir / "config.json").exists():
        return model_dir
    tokenizer = task.build_tokenizer(model_dir)
    model = task.build_model(tokenizer, seed=0, max_positions=max_positions) if shape == "demo" else \
        shaped_model(tokenizer, SHAPES[shape], max_positions)
    if warm_start:
        train_pairs, held_out = task.split_problems(0)
        task.supervised_warm_start(model, tokenizer, train_pairs, held_out, target=0.3, seed=0, max_seconds=60)
    if full_length:
        never_ends(model, tokenizer)
    model.save_pretrained(model_dir)
    return model_dir


def never_ends(model: Any, tokenizer: Any) -> None:
    """Unties the output layer and points the EOS (and pad) row against the direction the final hidden states share,
    so that EOS's logit sits far below every other (e^-30 or less at temperature 1) while the other tokens keep the
    random model's distribution. The same weights in every engine and trainer: no system's sampler needs a setting
    to suppress EOS (HF's ``min_new_tokens``, vLLM's ``ignore_eos`` and TRL's ``generation_kwargs`` differ)."""
    import torch

    ids = torch.randint(0, len(tokenizer), (8, 64), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        hidden = model.model(input_ids=ids).last_hidden_state.reshape(-1, model.config.hidden_size)
    shared = hidden.mean(0)
    floor = (hidden @ shared).min() / shared.norm()  # every state's projection on the shared direction is at least this
    if floor <= 0:
        raise SystemExit("grpo_step.py: the random model's final hidden states share no direction; try another seed")
    model.config.tie_word_embeddings = False
    head = model.get_input_embeddings().weight.detach().clone()
    head[[tokenizer.eos_token_id, tokenizer.pad_token_id]] = -shared / shared.norm() * (60.0 / floor)
    model.lm_head.weight = torch.nn.Parameter(head)


def shaped_model(tokenizer: Any, sizes: dict[str, int], max_positions: int) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), max_position_embeddings=max_positions, tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        **sizes))


def require_cuda() -> None:
    """``--device cuda`` where torch sees no GPU (or nvidia-smi is missing) ends here, with one line."""
    import torch

    if not torch.cuda.is_available():
        problem = f"torch {torch.__version__} sees no CUDA GPU on this machine"
    elif shutil.which("nvidia-smi") is None:
        problem = "nvidia-smi (which reads the GPU's memory) is not on PATH"
    else:
        return
    print(f"grpo_step.py: error: --device cuda: {problem}; run it on a machine with a CUDA GPU, or leave --device out "
          "for the CPU table", file=sys.stderr)
    raise SystemExit(2)


def run_system(system: str, work: Path, model: Path, *, prompts: int, samples: int, new_tokens: int, steps: int,
               label: str, warmup: int, rlhf_flags: tuple[str, ...] = (), device: str = "cpu") -> Run:
    from rlhf_plugin_demo import task
    from rlhf_plugin_demo.run import RL_MICRO_BATCH

    run_dir = work / "runs" / label
    run_dir.mkdir(parents=True, exist_ok=True)
    task.write_prompt_file(run_dir / "prompts.jsonl", task.split_problems(0)[0], prompts * steps, seed=1)
    (run_dir / "reward.py").write_text(task.REWARD_FILE)
    times = run_dir / "times.jsonl"
    times.unlink(missing_ok=True)
    spec = {"model": str(model), "prompt_file": str(run_dir / "prompts.jsonl"), "run_dir": str(run_dir),
            "times": str(times), "prompts": prompts, "samples": samples, "new_tokens": new_tokens, "steps": steps,
            "max_len": min(256, new_tokens + 16), "engine": SYSTEMS[system][1],
            "micro": min(RL_MICRO_BATCH, prompts * samples), "device": device,
            "rlhf_flags": [*SYSTEMS[system][2], *rlhf_flags]}
    gpu = GpuMemory() if device == "cuda" else None
    started, load_before = time.time(), load_average()
    process = subprocess.Popen([sys.executable, str(HERE / "grpo_workloads.py"), SYSTEMS[system][0], json.dumps(spec)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    sampler = TreeSampler(process.pid)
    _, stderr = process.communicate()
    samples = sampler.stop()
    gpu_peak = gpu.stop() if gpu else 0
    if process.returncode != 0:
        raise SystemExit(f"{system} failed (exit {process.returncode}):\n{stderr[-4000:]}")
    lines = [json.loads(line) for line in times.read_text().splitlines()]
    stamps = [line["t"] for line in lines]
    if system.startswith("raw"):
        step_times = [line["generation"] + line["train"] for line in lines[1:]]
    else:
        step_times = [b - a for a, b in zip(stamps, stamps[1:])]
    phases = {key: statistics.median(line[key] for line in lines[1:]) for key in PHASES
              if len(lines) > 1 and key in lines[0]}
    lengths = [line["response_length"] for line in lines if "response_length" in line]
    steady = stamps[1 + warmup:]  # the CPU of the steps the wall-clock median covers
    cpu = ((samples.cpu_at(steady[-1]) - samples.cpu_at(stamps[warmup])) / (len(steady))) if steady else float("nan")
    faults = training_faults(samples, lines) if not system.startswith("trl") else []
    plan = run_dir / "plan.json"  # rlhf on cuda (grpo_workloads.run_rlhf)
    plan_lines = planned_against_measured(json.loads(plan.read_text()), rank_peaks(run_dir / "gpu_peaks")) \
        if plan.exists() else []
    return Run(stamps[0] - started, step_times, statistics.mean(lengths) if lengths else float("nan"), phases, cpu,
               samples.peak_rss(), max(load_before, load_average()), gpu_peak=gpu_peak,
               gpu_alloc=max(line.get("gpu_alloc", 0) for line in lines), plan_lines=plan_lines,
               train_faults=[f for f, _, _ in faults], train_kernel=[k for _, k, _ in faults],
               train_faulters=[who for _, _, who in faults])


def available(systems: list[str]) -> list[str]:
    import importlib.util

    if "trl" in systems and importlib.util.find_spec("trl") is None:
        print("note: TRL is not installed (pip install -c constraints.txt -e '.[bench]'); its rows are left out")
        return [s for s in systems if s != "trl"]
    return systems


def measure(work: Path, model: Path, systems: list[str], repeats: int, warmup: int, quiet: tuple[float, float],
            rlhf_flags: tuple[str, ...] = (), device: str = "cpu", **sizes: Any) -> dict[str, list[Run]]:
    """Each system ``repeats`` times, interleaved (A B A B), each run after waiting for a quiet machine."""
    runs: dict[str, list[Run]] = {s: [] for s in systems}
    for repeat in range(repeats):
        for system in systems:
            calm, _ = wait_for_quiet(*quiet)
            tag = "x".join(str(v) for v in sizes.values())
            run = run_system(system, work, model, label=f"{system}-{tag}-{repeat}", warmup=warmup, rlhf_flags=rlhf_flags,
                             device=device, **sizes)
            run.steps, run.quiet = run.steps[warmup:], calm
            runs[system].append(run)
            gpu = f", GPU {run.gpu_peak / 2**20:.0f} MiB" if device == "cuda" else ""
            print(f"  {system} repeat {repeat + 1}: start-up {run.startup:.1f} s, median "
                  f"{statistics.median(run.steps):.3f} s/step, {run.cpu_per_step:.3f} CPU-s/step, peak "
                  f"{run.peak_rss / 2**20:.0f} MiB{gpu}, load {run.load:.2f}{'' if calm else ' (never quiet)'}", flush=True)
            if run.train_faults:
                print(f"    training phase per step: minor faults {', '.join(f'{f:,}' for f in run.train_faults)}; "
                      f"system CPU-s {', '.join(f'{k:.2f}' for k in run.train_kernel)}; most from "
                      f"{run.train_faulters[-1]}", flush=True)
    return runs


def table(runs: dict[str, list[Run]], samples_per_step: int, title: str, device: str = "cpu") -> None:
    from rich.console import Console
    from rich.table import Table

    def median(system: str) -> float | None:
        if system not in runs:
            return None
        return statistics.median(t for run in runs[system] for t in run.steps)

    def floor_of(engine: str) -> float | None:
        """Raw generation of this engine plus the fastest plain-torch update (vLLM in-process slows torch beside it)."""
        raw = [s for s in runs if s.startswith("raw-")]
        if f"raw-{engine}" not in runs:
            return None
        train = min(statistics.median(r.phases["train"] for r in runs[s]) for s in raw)
        return statistics.median(r.phases["generation"] for r in runs[f"raw-{engine}"]) + train

    def cpu_of(system: str) -> float:
        return statistics.median(r.cpu_per_step for r in runs[system])

    def gpu_of(system_runs: list[Run]) -> list[str]:
        """The GPU columns (--device cuda): the device's peak above the run's start, torch's allocator peak."""
        if device != "cuda":
            return []
        alloc = max(r.gpu_alloc for r in system_runs)
        return [f"{max(r.gpu_peak for r in system_runs) / 2**20:.0f}", f"{alloc / 2**20:.0f}" if alloc else "-"]

    out = Table(title=title)
    gpu_columns = ("GPU MiB", "alloc MiB") if device == "cuda" else ()
    for column in ("system", "s/step median", "CPU-s/step", "peak MiB", *gpu_columns, "load", "samples/s", "start-up s",
                   "resp. tokens", *(f"{phase} s" for phase in PHASES), "train faults 1 / later", "train sys s",
                   "vs TRL", "vs raw floor", "CPU vs raw"):
        out.add_column(column)
    trl = median("trl")
    for system, system_runs in runs.items():
        steps = [t for run in system_runs for t in run.steps]
        mid = statistics.median(steps)
        engine = SYSTEMS[system][1]
        floor = floor_of(engine) if system.startswith("rlhf") else None
        raw_cpu = cpu_of(f"raw-{engine}") if system.startswith("rlhf") and f"raw-{engine}" in runs else None
        phases = [f"{statistics.median(r.phases[k] for r in system_runs):.3f}" if k in system_runs[0].phases else "-"
                  for k in PHASES]
        loads = "/".join(f"{r.load:.1f}{'' if r.quiet else '!'}" for r in system_runs)
        faulted = [r for r in system_runs if len(r.train_faults) > 1]
        faults = (f"{statistics.median(r.train_faults[0] for r in faulted) / 1e3:.0f}k / "
                  f"{statistics.median(f for r in faulted for f in r.train_faults[1:]) / 1e3:.1f}k") if faulted else "-"
        kernel = f"{statistics.median(k for r in faulted for k in r.train_kernel[1:]):.2f}" if faulted else "-"
        out.add_row(system, f"{mid:.3f}", f"{cpu_of(system):.3f}", f"{max(r.peak_rss for r in system_runs) / 2**20:.0f}",
                    *gpu_of(system_runs), loads, f"{samples_per_step / mid:.0f}", f"{statistics.median(r.startup for r in system_runs):.1f}",
                    f"{statistics.mean(r.response_length for r in system_runs):.1f}", *phases, faults, kernel,
                    f"{trl / mid:.2f}x" if trl else "", f"{100 * (mid / floor - 1):+.0f} %" if floor else "",
                    f"{100 * (cpu_of(system) / raw_cpu - 1):+.0f} %" if raw_cpu else "")
    Console(width=220).print(out)
    print("vs TRL: samples/s relative to TRL's (2.00x = twice as fast); vs raw floor: step time above the same "
          "engine's raw generate plus the fastest plain-torch update of the same batch; CPU vs raw: CPU-seconds per "
          "step of the whole process tree above the same engine's raw floor; load: 1-minute load average per run "
          "(! = never under --quiet_load); resp. tokens: mean response length (the systems must agree within "
          "--length_tolerance); generation/train/sync s: median seconds per step of each phase (TRL's train: its step "
          "less its generation and scoring; the floor has no sync); train faults: minor page faults of the whole "
          "process tree in the training phase of step 1 / of each later step (median), train sys s: its kernel "
          "CPU-seconds in a later step's training phase (a step after the warm-up that faults in more than "
          f"{100 * FAULT_SHARE:.0f} % of step 1's fails the run)" + ("; GPU MiB: the GPU's memory.used at its peak above the run's start "
          "(nvidia-smi, every process of the run); alloc MiB: torch.cuda.max_memory_allocated() in the system's own "
          "process (- where the model lives in another process)" if device == "cuda" else ""))
    for system, system_runs in runs.items():  # on cuda: rlhf plan's peak per GPU against each rank's allocator peak
        for line in system_runs[-1].plan_lines:
            print(f"planned against measured, {system}: {line}")


def length_mismatch(runs: dict[str, list[Run]], tolerance: float) -> str | None:
    """Where the systems' mean response lengths differ by more than ``tolerance`` (0.10: 10 %), what differs: a
    step time is only comparable on the same number of tokens."""
    lengths = {system: statistics.mean(r.response_length for r in system_runs) for system, system_runs in runs.items()}
    shortest, longest = min(lengths.values()), max(lengths.values())
    if longest <= shortest * (1 + tolerance):
        return None
    listed = ", ".join(f"{system} {length:.1f}" for system, length in lengths.items())
    return (f"the systems' mean response lengths differ by more than {100 * tolerance:.0f} % ({listed} tokens), so "
            "their step times are not comparable; run them on responses that reach the limit (--responses full)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="cuda: on one GPU, bf16, a --model_shape model (default 0.5b), 64 prompts, 64 new tokens")
    parser.add_argument("--model_shape", choices=tuple(SHAPES), help="the random model's shape on cuda (default 0.5b); "
                        "on cpu the demo's model, supervised to 30 %% accuracy")
    parser.add_argument("--systems", help=f"comma-separated, from {', '.join(SYSTEMS)} (default: "
                        f"{','.join(DEFAULT_SYSTEMS)}; on cuda {','.join(DEFAULT_GPU_SYSTEMS)})")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--steps", type=int, default=14, help="steps per process")
    parser.add_argument("--warmup", type=int, default=3, help="steps left out of the steady state, after the first")
    parser.add_argument("--prompts", type=int, help="default 32 (cuda: 64)")
    parser.add_argument("--samples", type=int, default=8)
    parser.add_argument("--new_tokens", type=int, help="default 8 (cuda: 64)")
    parser.add_argument("--grid", action="store_true", help="prompts/step 8/32/128 x new tokens 8/32/128, 1 repeat")
    parser.add_argument("--grid_prompts", default="8,32,128", help="--grid's prompts/step values (comma-separated)")
    parser.add_argument("--grid_tokens", default="8,32,128", help="--grid's new-token values (comma-separated)")
    parser.add_argument("--responses", choices=("early", "full"), help="early: the demo's model, whose responses stop "
                        "early (the table's default: 6-20 tokens); full: a random model that never emits EOS, so every "
                        "response runs to --new_tokens (--smoke's default); --grid runs both grids unless this is given")
    parser.add_argument("--length_tolerance", type=float, default=0.10, help="the run fails where the systems' "
                        "mean response lengths differ by more than this fraction (default 0.10)")
    parser.add_argument("--smoke", action="store_true", help="2 steps of each system, 1 repeat (CI)")
    parser.add_argument("--rlhf_flags", default="", help="extra `rlhf train ppo` flags for the rlhf systems "
                        "(one string, split like a shell), e.g. '--vllm.sync_backend gloo' for an A/B")
    parser.add_argument("--work", type=Path, help="where models and runs go (default: a temporary directory)")
    parser.add_argument("--quiet_load", type=float, default=1.5, help="wait for the 1-minute load to fall under this")
    parser.add_argument("--quiet_wait", type=float, default=120, help="seconds to wait for it at most, per run")
    parser.add_argument("--results", type=Path, help="write each system's s/step per shape here (JSON)")
    parser.add_argument("--chart", type=Path, help="draw them here (PNG; the JSON beside it unless --results), as "
                        "the README's and docs/performance.md's chart (benchmarks/step_chart.py redraws a saved JSON)")
    args = parser.parse_args()
    cuda = args.device == "cuda"
    if cuda:
        require_cuda()
    shape = args.model_shape or ("0.5b" if cuda else "demo")
    args.prompts = args.prompts or (64 if cuda else 32)
    args.new_tokens = args.new_tokens or (64 if cuda else 8)
    systems = available((args.systems or ",".join(DEFAULT_GPU_SYSTEMS if cuda else DEFAULT_SYSTEMS)).split(","))
    if args.smoke:
        args.repeats, args.steps, args.warmup, args.quiet_wait = 1, 2, 0, 0
    quiet = (args.quiet_load, args.quiet_wait)
    flags = tuple(shlex.split(args.rlhf_flags))
    on = f" on {device_name()}, bf16, the {shape} model" if cuda else ""
    mismatches, regressions = [], []
    with tempfile.TemporaryDirectory(prefix="grpo_step_") as tmp:
        work = args.work or Path(tmp)
        if not args.grid:  # only the demo's model is warm-started; a random one's responses run to the token budget
            full = (args.responses or ("full" if args.smoke else "early")) == "full"
            positions = 512 if cuda else max(64, min(256, args.new_tokens + 16))
            model = prepare(work, positions, warm_start=shape == "demo" and not (args.smoke or cuda or full), shape=shape,
                            full_length=full)
            sizes = {"prompts": args.prompts, "samples": args.samples, "new_tokens": args.new_tokens, "steps": args.steps}
            runs = measure(work, model, systems, args.repeats, args.warmup, quiet, flags, args.device, **sizes)
            table(runs, args.prompts * args.samples, f"GRPO step{on}, {args.prompts} prompts x {args.samples} samples, "
                  f"{args.new_tokens} new tokens, responses {'to the limit' if full else 'stopping early'} "
                  f"({args.repeats} repeats x {args.steps} steps, first {args.warmup + 1} left out)", args.device)
            mismatches.append(length_mismatch(runs, args.length_tolerance))
            regressions += fault_regressions(runs, args.warmup)
            shapes = [shape_record(runs, responses="full" if full else "early", **sizes)]
        else:
            shapes = []
            for responses in [args.responses] if args.responses else ["early", "full"]:
                # random weights: the early grid's responses stop after 6-20 tokens, the full grid's never do
                model = prepare(work, 512 if cuda else 256, warm_start=False, shape=shape, full_length=responses == "full")
                for prompts in map(int, args.grid_prompts.split(",")):
                    for new_tokens in map(int, args.grid_tokens.split(",")):
                        sizes = {"prompts": prompts, "samples": args.samples, "new_tokens": new_tokens, "steps": 5}
                        runs = measure(work, model, systems, 1, 1, quiet, flags, args.device, **sizes)
                        table(runs, prompts * args.samples, f"grid{on}, responses {responses}: {prompts} prompts x "
                              f"{args.samples} samples, {new_tokens} new tokens", args.device)
                        shapes.append(shape_record(runs, responses=responses, **sizes))
                        mismatches.append(length_mismatch(runs, args.length_tolerance))
                        regressions += fault_regressions(runs, 1)
        save(shapes, device_name() if cuda else cpu_machine(), args.results, args.chart)
    problems = [*filter(None, mismatches), *regressions]
    for problem in problems:
        print(f"grpo_step.py: error: {problem}", file=sys.stderr)
    if problems:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
