"""One rank of the FSDP2 backend checks (gloo, CPU), and the plain-torch reference they are compared with.

Usage: RANK=… WORLD_SIZE=… MASTER_ADDR=… MASTER_PORT=… python fsdp2_ranks.py MODEL_DIR OUT_DIR RESUME_PORT

1. Two optimizer steps with fixed micro-batches (accumulation 2), saving a checkpoint after the first;
   rank 0 writes ``fixed_step{1,2}.pt`` (``state_dict()``); every rank writes ``views_rank{r}.pt``
   (``state_dict()``'s None-ness, ``full_tensors``, ``full_shape``, the parameters inside ``gathered()``,
   the ``step()`` results and learning rates).
2. A fresh model trains two steps with explicit boundaries (3 micro-batches each, the last one True);
   rank 0 writes ``dynamic_step{1,2}.pt``. Every rank writes ``evaluated_rank{r}.pt``: an evaluated
   model's logits and trainable parameters, and one step of a ``--ds.param_dtype bf16`` model (its
   logits' dtype, ``step()``, ``state_dict()``).
3. The process group is destroyed and formed anew (on RESUME_PORT); a fresh model tries a missing and a
   damaged checkpoint (every rank writes the errors to ``errors_rank{r}.json``), loads the one of step 1
   and trains step 2; rank 0 writes ``resumed_step2.pt``.

One launch does all three: on a busy 2-core machine importing transformers costs more than the checks.
The test imports this module for the data, the factories and :func:`reference` (``main`` runs only as a script).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch
import torch.distributed as dist
from rlhf_plugin_fsdp2.backend import FSDP2Backend

from rlhf.errors import CheckpointError

WORLD = 2
MICRO = 2  # sequences per micro-batch
BATCH = 8  # sequences per optimizer step over both ranks: accumulation 8 // (2 x 2) = 2
LR, EPS, WEIGHT_DECAY = 1e-2, 1e-3, 0.01  # eps near the clipped gradients' size, so clipping shows in AdamW's update
MAX_NORM = 0.05  # far below the tiny model's gradient norm (about 4): every step clips
DYNAMIC_MICRO = 3  # micro-batches per rank and step with explicit boundaries


def micro_batch(kind: str, rank: int, step: int, index: int) -> torch.Tensor:
    """Token ids ``(MICRO, 12)`` of one rank's micro-batch, the same in every process."""
    seed = {"fixed": 0, "dynamic": 1000}[kind] + 100 * step + 10 * rank + index
    return torch.randint(0, 64, (MICRO, 12), generator=torch.Generator().manual_seed(seed))


def micro_batches(kind: str, rank: int, step: int) -> list[torch.Tensor]:
    return [micro_batch(kind, rank, step, i) for i in range(2 if kind == "fixed" else DYNAMIC_MICRO)]


class AdamWFactory:
    """The optimizer component: torch AdamW."""

    def build(self, params: Any, section: Any) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=section.lr, eps=EPS, weight_decay=WEIGHT_DECAY)


class HalvingSchedule:
    """The scheduler component: lr / (1 + step), so a resume that lost the scheduler shows."""

    def build(self, optimizer: Any, num_training_steps: int, section: Any) -> Any:
        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 / (1 + step))


def config(param_dtype: str = "fp32") -> SimpleNamespace:
    return SimpleNamespace(ds=SimpleNamespace(param_dtype=param_dtype),
                           train=SimpleNamespace(micro_batch_size=MICRO, batch_size=BATCH))


def section(max_norm: float = MAX_NORM) -> SimpleNamespace:
    return SimpleNamespace(lr=LR, max_norm=max_norm)


def load(model_dir: str) -> Any:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def reference(model_dir: str, kind: str, steps: int, max_norm: float = MAX_NORM) -> list[dict[str, torch.Tensor]]:
    """Plain single-process torch: per step, the gradient of (fixed) the mean loss over every micro-batch of
    every rank, or (explicit boundaries, undivided losses averaged over the ranks) their sum over ``WORLD``;
    ``clip_grad_norm_``, AdamW, the schedule. The weights after each step."""
    model = load(model_dir)
    optimizer = AdamWFactory().build(model.parameters(), section())
    scheduler = HalvingSchedule().build(optimizer, steps, section())
    states = []
    for step in range(steps):
        batches = [b for rank in range(WORLD) for b in micro_batches(kind, rank, step)]
        losses = torch.stack([model(input_ids=b, labels=b).loss for b in batches])
        (losses.mean() if kind == "fixed" else losses.sum() / WORLD).backward()
        if max_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    return states


def train_step(model: Any, kind: str, rank: int, step: int) -> list[bool]:
    """One optimizer step's micro-batches on this rank; what each ``step()`` returned."""
    batches = micro_batches(kind, rank, step)
    stepped = []
    for i, ids in enumerate(batches):
        loss = model(input_ids=ids, labels=ids).loss
        model.backward(loss, None if kind == "fixed" else i == len(batches) - 1)
        stepped.append(model.step())
    return stepped


def main(model_dir: str, out: Path, resume_port: str) -> None:
    backend = FSDP2Backend.from_config(config())
    backend.init_distributed()
    rank = dist.get_rank()

    def trained() -> Any:
        return backend.trained(lambda: load(model_dir), AdamWFactory(), HalvingSchedule(), section(), WORLD, 2)

    def dump(state: Any, name: str) -> None:
        if rank == 0:
            torch.save(state, out / name)

    fixed_steps(trained(), rank, out, dump)
    dynamic = trained()
    for step in range(2):
        train_step(dynamic, "dynamic", rank, step)
        dump(dynamic.state_dict(), f"dynamic_step{step + 1}.pt")
    evaluated(backend, model_dir, rank, out)
    dist.destroy_process_group()

    os.environ["MASTER_PORT"] = resume_port
    backend.init_distributed()
    resume(trained(), rank, out, dump)
    dist.destroy_process_group()


def fixed_steps(model: Any, rank: int, out: Path, dump: Any) -> None:
    """Part 1 of the module docstring."""
    model.train()
    views: dict[str, Any] = {"accumulation": model.accumulation_steps(), "stepped": [], "lr": []}
    for step in range(2):
        views["stepped"] += train_step(model, "fixed", rank, step)
        views["lr"].append(model.learning_rate())
        state = model.state_dict()
        views[f"state_is_none_{step + 1}"] = state is None
        dump(state, f"fixed_step{step + 1}.pt")
        if step == 0:
            model.save_checkpoint(str(out / "ckpt"), "model")
    names = list(model.module.state_dict(keep_vars=True))
    with model.full_tensors(names) as tensors:
        views["full_tensors"] = {n: t.detach().clone() for n, t in zip(names, tensors, strict=True)}
    views["full_shapes"] = {n: model.full_shape(t) for n, t in model.module.state_dict(keep_vars=True).items()}
    with model.gathered():
        views["gathered"] = {n: p.detach().clone() for n, p in model.module.named_parameters()}
    torch.save(views, out / f"views_rank{rank}.pt")


def evaluated(backend: Any, model_dir: str, rank: int, out: Path) -> None:
    """The evaluated model and the bf16 step of part 2."""
    frozen = backend.evaluated(lambda: load(model_dir), True, MICRO)  # offload: ignored on the CPU
    frozen.eval()
    probe = micro_batch("fixed", rank, 0, 0)
    with torch.no_grad():
        logits = frozen(input_ids=probe).logits
    trainable = [name for name, p in frozen.module.named_parameters() if p.requires_grad]
    mixed = FSDP2Backend(config("bf16")).trained(lambda: load(model_dir), AdamWFactory(), HalvingSchedule(),
                                                  section(), WORLD, 2)
    output = mixed(input_ids=probe, labels=probe)
    mixed.backward(output.loss, True)
    torch.save({"logits": logits, "trainable": trainable, "bf16_logits_dtype": output.logits.dtype,
                "bf16_stepped": mixed.step(), "bf16_state": mixed.state_dict()}, out / f"evaluated_rank{rank}.pt")


def resume(model: Any, rank: int, out: Path, dump: Any) -> None:
    """Part 3 of the module docstring, in a fresh process group."""
    model.train()
    damaged = out / "damaged"
    if rank == 0:
        shutil.copytree(out / "ckpt", damaged)
        (damaged / "model" / "__1_0.distcp").unlink()  # rank 1's shards
    dist.barrier()
    errors = {}
    for label, directory in (("missing", out / "nowhere"), ("damaged", damaged)):
        try:
            model.load_checkpoint(str(directory), "model")
        except CheckpointError as exc:
            errors[label] = str(exc)
    (out / f"errors_rank{rank}.json").write_text(json.dumps(errors))
    model.load_checkpoint(str(out / "ckpt"), "model")
    train_step(model, "fixed", rank, 1)
    dump(model.state_dict(), "resumed_step2.pt")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3])
