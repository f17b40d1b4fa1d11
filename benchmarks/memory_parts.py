"""The plan's parts of the actor's GPU measured one by one, at memory_scaling.py's shape (issue 57: plan against peak).

    python benchmarks/memory_parts.py                  # keep_freed_memory off: each part as its phase holds it
    python benchmarks/memory_parts.py --keep --steps 6 # on: the heap's resident size, step after step

memory_scaling.py reads one peak per step; this splits a step into the phases where the plan's parts come and go.
One process loads memory_scaling.py's random 151,936-token Llama and runs the actor's step as the ZeRO-0 rank on
a CPU does it, with its micro-batches (``MICRO`` sequences of the prompts' 7 tokens and ``NEW_TOKENS`` random
response tokens): the experience forward and its log-probs without gradient, then per training micro-batch the
forward, ``rlhf.ops.chunked_logprobs`` over the action tokens, a GRPO-like loss and the backward, then clipping
and the optimizer step (torch's AdamW with ``foreach``, as the deepspeed plugin configures it on a CPU). Around
each phase the process's high-water mark (``VmHWM``) is read and reset (``/proc/self/clear_refs``): a phase's
peak and what it leaves resident, above the resident size as it began. Beside each stands the part ``rlhf plan``
counts for the same flags.

A benchmark, not a test: the figures are bytes, not seconds, so the machine's load does not move them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from memory_report import MiB  # beside this script (on sys.path as it runs)
from memory_scaling import MICRO, NEW_TOKENS, PROMPT_TOKENS, prepare, train_flags

#: how each planned part is read: (part, first phase, last phase, "peak" or "rest"): the first phase's peak, or what
#: the phases from the first to the last left resident (the gradients: the first micro-batch's forward to its
#: backward, which frees the logits it made). The logits' gradient is the backward's peak less the chunk's.
MEASURED_AS = (("weights", "weights paged in", "weights paged in", "rest"),
               ("logits", "training forward", "training forward", "rest"),
               ("log-prob chunk", "log-probs", "log-probs", "peak"),
               ("logits' gradient and a chunk", "backward", "backward", "peak"),
               ("gradients", "training forward", "first backward", "rest"),
               ("optimizer states", "first optimizer step", "first optimizer step", "rest"))


class Marks:
    """The process's resident memory, phase by phase: each phase's peak and rest above the resident size at its start."""

    def __init__(self) -> None:
        self.start, self.phases, self.steps = self._read()["vmrss"], [], []
        self.first = self.start  # before the model
        self._reset()

    @staticmethod
    def _read() -> dict[str, int]:
        fields = dict(line.split(":", 1) for line in open("/proc/self/status") if line.startswith(("VmRSS", "VmHWM")))
        return {key.lower(): int(value.split()[0]) * 1024 for key, value in fields.items()}

    @staticmethod
    def _reset() -> None:
        with open("/proc/self/clear_refs", "w") as handle:
            handle.write("5")

    def phase(self, name: str) -> None:
        now = self._read()
        self.phases.append({"phase": name, "begin": self.start, "high": now["vmhwm"], "resident": now["vmrss"]})
        self.start = now["vmrss"]
        self._reset()

    def step_end(self) -> None:
        """A step's peak and its resident size at its end, both above the process before its model."""
        begin = self.steps[-1]["phases"] if self.steps else 0
        high = max(p["high"] for p in self.phases[begin:])
        self.steps.append({"phases": len(self.phases), "peak": high - self.first, "rest": self.start - self.first})

    def reading(self, first: str, last: str, kind: str) -> int | None:
        """The first ``first`` phase's peak, or the resident size from its start to the first ``last`` phase after it."""
        begin = next((i for i, p in enumerate(self.phases) if p["phase"] == first), None)
        if begin is None:
            return None
        if kind == "peak":
            return self.phases[begin]["high"] - self.phases[begin]["begin"]
        end = next(i for i, p in enumerate(self.phases) if i >= begin and p["phase"] == last)
        return self.phases[end]["resident"] - self.phases[begin]["begin"]


def run_steps(model_dir: Path, steps: int, marks: Marks) -> None:
    """The actor's steps as a CPU rank runs them (module docstring), ``marks.phase`` after each phase; the libraries
    are imported before ``marks`` began, as a rank's are before its model."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlhf.runtime.workers.batch import action_logprobs, pack

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    for parameter in model.parameters():  # from_pretrained maps the file: its pages come in as they are first read
        parameter.data.sum()
    marks.phase("weights paged in")
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, foreach=True)
    generator, vocab = torch.Generator().manual_seed(0), model.config.vocab_size
    for step in range(steps):
        prompts = [[1] + torch.randint(3, 20, (PROMPT_TOKENS - 1,), generator=generator).tolist() for _ in range(MICRO)]
        responses = [torch.randint(3, vocab, (NEW_TOKENS,), generator=generator).tolist() for _ in range(MICRO)]
        batch = pack(prompts, responses, 0)
        with torch.no_grad():
            action_logprobs(model(**batch.model_inputs()).logits, batch)
        marks.phase("experience forward and log-probs")
        for _ in range(2):  # memory_scaling.py's 8 prompts x 2 samples: two training micro-batches
            logits = model(**batch.model_inputs()).logits
            marks.phase("training forward")
            logp, _ = action_logprobs(logits, batch)
            del logits  # the log-probs' autograd node holds them for the backward
            marks.phase("log-probs")
            advantages = torch.randn(logp.shape, generator=generator)
            (-(logp * advantages * batch.action_mask).sum() / batch.action_mask.sum()).backward()
            del logp
            marks.phase("first backward" if step == 0 and not any(p["phase"] == "first backward" for p in marks.phases)
                        else "backward")
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        marks.phase("first optimizer step" if step == 0 else "optimizer step")
        marks.step_end()


def planned_parts(work: Path, model_dir: Path) -> dict[str, int]:
    """``rlhf plan``'s parts of the actor's GPU for memory_scaling.py's flags (8 prompts, ZeRO-0, HF in the rank)."""
    flags = train_flags(work / "plan", model_dir, "hf-inprocess", "zero0", 8)
    done = subprocess.run([sys.executable, "-m", "rlhf", "plan", "train", "ppo", *flags, "--json"], capture_output=True,
                          text=True, check=True)
    plan = json.loads(done.stdout)
    return {f"{group} {part['part']}": part["bytes"] for group, parts in plan["parts"].items() for part in parts}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", action="store_true", help="keep_freed_memory on (a run's default); off otherwise")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--work", type=Path, help="where the model goes (default: a temporary directory)")
    args = parser.parse_args()
    os.environ["RLHF_KEEP_FREED_MEMORY"] = "1" if args.keep else "0"
    with tempfile.TemporaryDirectory(prefix="memory_parts_") as tmp:
        work = args.work or Path(tmp)
        model_dir = prepare(work)
        planned = planned_parts(work, model_dir)
        import torch
        import transformers.models.llama.modeling_llama  # noqa: F401  (the rank's libraries, before its model)

        import rlhf.runtime.workers.batch  # noqa: F401
        from rlhf.runtime.cluster.host_memory import keep_freed_memory

        torch.set_num_threads(1)  # one allocating thread: one glibc arena, as a phase-by-phase reading needs
        kept = keep_freed_memory()
        marks = Marks()
        run_steps(model_dir, args.steps, marks)
    print(f"keep_freed_memory {'on' if kept else 'off'}; MiB")
    for phase in marks.phases:
        print(f"  {phase['phase']:34s} peak {(phase['high'] - phase['begin']) / MiB:+7.1f}  "
              f"rest {(phase['resident'] - phase['begin']) / MiB:+7.1f}  (above the resident size as it began)")
    for number, step in enumerate(marks.steps):
        print(f"  step {number}: peak {step['peak'] / MiB:.0f}, resident at its end {step['rest'] / MiB:.0f} "
              "(above the process before its model)")
    print("planned against measured (MiB):")
    readings = {part: marks.reading(first, last, kind) for part, first, last, kind in MEASURED_AS}
    readings["logits"] += readings.pop("logits' gradient and a chunk") - readings["log-prob chunk"]
    for part, nbytes in planned.items():
        group, name = part.split(" ", 1)
        measured = readings.get(name) if group == "actor" else None
        print(f"  {part:24s} {nbytes / MiB:7.1f}  " + (f"{measured / MiB:7.1f}" if measured is not None else "      -"))
    print(f"the last step's peak above the process before its model: {marks.steps[-1]['peak'] / MiB:.0f} MiB; "
          f"the plan: {sum(planned.values()) / MiB:.0f} MiB")

if __name__ == "__main__":
    main()
