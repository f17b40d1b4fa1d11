"""Kit for training backends: one rank trains the tiny model and is checked against plain torch.

The backend under test runs in the test process as a one-rank group (gloo): it trains two
optimizer steps of two micro-batches each with AdamW and gradient clipping, and every step's
weights must equal those of the same steps written in plain torch (the mean loss of the step's
micro-batches, ``clip_grad_norm_``, ``AdamW``), and a state dict taken after a step must not change with the next
one (it is a copy, also where a one-rank "gather" moves nothing). Then: the full state dict and the whole tensors a
weight sync reads, the learning rate, an evaluated model's forward, ``device`` (where the parameters are,
and a step on a simulated accelerator, :mod:`rlhf.testing.accelerator`, where a CPU tensor the backend
builds for itself fails as on a GPU), and an exact resume from a checkpoint saved after step 1. A backend
that shards runs the same code; its sharding is tested with more ranks in its own tests.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlhf.components import build
from rlhf.distributed import group_environment, restored_process
from rlhf.errors import CheckpointError
from rlhf.registry import ComponentKind
from rlhf.testing.accelerator import put_on_accelerator, simulated_accelerator
from rlhf.testing.conformance._core import (
    ComponentKit,
    ContractProperties,
    check_picklable,
    first_failure,
    not_collected,
    ppo_config,
)
from rlhf.testing.conformance.planning import check_backend_plan, check_backend_remedies

if TYPE_CHECKING:
    from rlhf.config.ppo import PPOConfig

BACKEND = ComponentKind.TRAINING_BACKEND.label
#: fp32 tolerance between a backend's weights and plain torch's after the same steps
WEIGHT_TOLERANCE = 1e-5
LR, MAX_NORM, MICRO, STEPS = 1e-2, 0.05, 2, 2


class _AdamW:
    """The kit's optimizer factory (both forms: a DeepSpeed block and a torch optimizer)."""

    def deepspeed_config(self, section: Any) -> dict[str, Any]:
        return {"type": "AdamW", "params": {"lr": LR, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0}}

    def build(self, params: Any, section: Any) -> Any:
        import torch

        return torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)


class _Constant:
    def build(self, optimizer: Any, num_training_steps: int, section: Any) -> Any:
        import torch

        return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)


def kit_config(config: PPOConfig | None = None) -> PPOConfig:
    """The run config the kit trains with: fp32, micro-batches of 2, two of them per optimizer step."""
    config = config if config is not None else ppo_config()
    config.ds.param_dtype, config.ds.attn_implementation = "fp32", "eager"
    config.train.micro_batch_size, config.train.batch_size = MICRO, 2 * MICRO
    config.actor.max_norm = MAX_NORM
    return config


def _join_one_rank_group(backend: Any) -> None:
    """A one-rank group, never one on launcher variables inherited from elsewhere (the group this process already
    joined, if an earlier in-process run left one). They stay set for the kit's pass (DeepSpeed reads LOCAL_RANK
    later)."""
    group_environment(launcher=False)
    backend.init_distributed()


def _batches(vocab: int) -> list[Any]:
    import torch

    generator = torch.Generator().manual_seed(0)
    return [torch.randint(3, vocab, (MICRO, 10), generator=generator) for _ in range(2 * STEPS)]


def _plain_torch(model_path: str) -> dict[str, Any]:
    """What plain torch makes of the tiny model: the kit's ``batches``, the weights after each optimizer ``steps``, the
    untrained model's ``logits`` of the first batch and the trainable parameters' ``shapes``. Made before the backend
    under test is built: a ZeRO-3 backend switches transformers to partitioned loading for the whole process, and a
    plain model loaded after that would have empty weights."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation="eager")
    batches = _batches(model.config.vocab_size)
    with torch.no_grad():
        logits = model.eval()(input_ids=batches[0]).logits
    shapes = {name: tuple(p.shape) for name, p in model.named_parameters() if p.requires_grad}
    model.train()
    optimizer = _AdamW().build(model.parameters(), None)
    states = []
    for step in range(STEPS):
        for ids in batches[2 * step: 2 * step + 2]:
            (model(input_ids=ids, labels=ids).loss / 2).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        optimizer.step()
        optimizer.zero_grad()
        states.append({k: v.detach().clone() for k, v in model.state_dict().items()})
    return {"batches": batches, "steps": states, "logits": logits, "shapes": shapes}


def _far(got: dict[str, Any] | None, want: dict[str, Any], tolerance: float) -> str | None:
    if got is None or set(got) != set(want):
        return f"state dict keys {sorted(got or {})[:4]}… are not the model's {sorted(want)[:4]}…"
    worst = max(want, key=lambda k: float((got[k].float() - want[k]).abs().max()))
    difference = float((got[worst].float() - want[worst]).abs().max())
    return None if difference <= tolerance else f"{worst} differs from plain torch's by {difference:.3g}"


def check_training_backend(backend_class: type, model_path: Any, config: Any = None,
                           weight_tolerance: float = WEIGHT_TOLERANCE) -> None:
    """Build ``backend_class`` for ``config`` (a run config, default a PPO one; the kit sets it to fp32, eager
    attention and micro-batches of 2, two per optimizer step) and check the protocol's contract
    on the tiny causal LM at ``model_path``, in this process; afterwards the process is as it was
    (:func:`rlhf.distributed.restored_process`: a backend sets variables for its library, such as DeepSpeed's
    ``DS_ACCELERATOR``, which a later child of the test would inherit). ``weight_tolerance``: how far the weights
    after the backend's steps, and an evaluated model's logits, may be from plain torch's (the largest absolute
    difference of any element); raise it only for a backend whose own kernels round differently, and say which."""
    with restored_process():
        _check_training_backend(backend_class, model_path, config, weight_tolerance)


def _check_training_backend(backend_class: type, model_path: Any, config: PPOConfig | None, tolerance: float) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    path = str(model_path)
    plain = _plain_torch(path)
    batches, want = plain["batches"], plain["steps"]
    config = kit_config(config)
    backend = build(backend_class, config)
    _join_one_rank_group(backend)

    def load() -> Any:
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")

    def trained() -> Any:
        return backend.trained(load, _AdamW(), _Constant(), config.actor, 1, STEPS)

    model = trained()

    def train_step(target: Any, step: int) -> list[bool]:
        target.train()
        stepped = []
        for ids in batches[2 * step: 2 * step + 2]:
            target.backward(target(input_ids=ids, labels=ids).loss)
            stepped.append(target.step())
        return stepped

    def accumulation() -> str | None:
        got = model.accumulation_steps()
        return None if got == 2 else f"accumulation_steps() is {got} for batch_size 4, micro_batch_size 2, one rank"

    def steps() -> str | None:
        earlier: dict[str, Any] | None = None
        for step in range(STEPS):
            stepped = train_step(model, step)
            if stepped != [False, True]:
                return f"step() returned {stepped} over one optimizer step's two micro-batches, expected [False, True]"
            if earlier is not None and _far(earlier, want[step - 1], tolerance):
                return (f"state_dict() taken after step {step} changed with step {step + 1}: it returns the live "
                        "weights, not a copy")
            earlier = model.state_dict()
            problem = _far(earlier, want[step], tolerance)
            if problem:
                return f"after optimizer step {step + 1}: {problem}"
        return None

    def learning_rate() -> str | None:
        got = model.learning_rate()
        return None if isinstance(got, float) and abs(got - LR) < 1e-12 else f"learning_rate() is {got!r}, expected {LR}"

    def full_tensors() -> str | None:
        live = model.module.state_dict(keep_vars=True)
        names = sorted(live)[:3]
        with model.full_tensors(names) as tensors:
            got = {name: tensor.detach().cpu().clone() for name, tensor in zip(names, tensors)}
        shapes = {name: tuple(model.full_shape(live[name])) for name in names}
        expected = {name: want[-1][name] for name in names}
        if any(shapes[n] != tuple(expected[n].shape) for n in names):
            return f"full_shape gives {shapes}, the model's shapes are { {n: tuple(t.shape) for n, t in expected.items()} }"
        return _far(got, expected, tolerance)

    def evaluated() -> str | None:
        frozen = backend.evaluated(load, False, MICRO)
        frozen.eval()
        with torch.no_grad():
            got, expected = frozen(input_ids=batches[0]).logits, plain["logits"]
        difference = float((got.float() - expected).abs().max())
        return None if difference <= tolerance else f"an evaluated model's logits differ by {difference:.3g}"

    def device() -> str | None:
        where = {parameter.device for parameter in model.module.parameters()}
        return None if where == {torch.device(model.device)} else f"device is {model.device}, the parameters are on {where}"

    def on_its_device() -> str | None:
        """What a GPU demands, on a simulated accelerator: a step and an evaluated forward fed inputs moved to
        ``.device`` must build nothing of their own on the CPU (rlhf.testing.accelerator)."""
        with simulated_accelerator():
            target = put_on_accelerator(trained())
            ids = batches[0].to(target.device)
            target.train()
            target.backward(target(input_ids=ids, labels=ids).loss)
            target.step()
            frozen = put_on_accelerator(backend.evaluated(load, False, MICRO))
            frozen.eval()
            with torch.no_grad():
                logits = frozen(input_ids=batches[0].to(frozen.device)).logits
            state = target.state_dict()
            stray = [name for name, tensor in (state or {}).items() if tensor.device.type != "cpu"]
            shape = tuple(logits.shape)
        if stray:
            return f"state_dict() left {stray[:3]} on the device; it returns CPU tensors"
        return None if shape[:2] == tuple(batches[0].shape) else f"an evaluated forward gave logits of shape {shape}"

    def resume() -> str | None:
        with tempfile.TemporaryDirectory() as directory:
            first = trained()
            train_step(first, 0)
            first.save_checkpoint(directory, "model")
            saved = first.state_dict()
            train_step(first, 1)
            after = first.state_dict()
            second = trained()
            second.load_checkpoint(directory, "model")
            train_step(second, 1)
            resumed = second.state_dict()
            if after is None or resumed is None or any(not torch.equal(after[k], resumed[k]) for k in after):
                return "step 2 after load_checkpoint(step 1's checkpoint) is not bit-identical to step 2 without the break"
            try:
                trained().load_checkpoint(str(Path(directory) / "nothing-here"), "model")
            except CheckpointError:
                return exported(directory, saved, second.module) or neutral(directory, after)
            return "load_checkpoint of a directory without a checkpoint did not raise CheckpointError"

    def exported(directory: str, saved: dict[str, Any] | None, module: Any) -> str | None:
        """The optional full_state_from_checkpoint (``rlhf checkpoint export``) reads back the saved weights."""
        read = getattr(backend_class, "full_state_from_checkpoint", None)
        if read is None or saved is None:
            return None
        state = read(directory, "model", module)
        wrong = [k for k in saved if k not in state or not torch.allclose(state[k].float(), saved[k].float(), atol=1e-6)]
        return f"full_state_from_checkpoint differs from the saved weights at {wrong[:3]}" if wrong else None

    def neutral(directory: str, after: dict[str, Any] | None) -> str | None:
        """The optional backend-neutral full state (a resume under another backend): ``optimizer_state_from_checkpoint``
        gives each trainable parameter's states whole, and the step count; with ``load_full_state`` too, a model
        loaded through it (and its scheduler stepped as often) takes step 2 as the uninterrupted run did."""
        read = getattr(backend_class, "optimizer_state_from_checkpoint", None)
        if read is None:
            return None
        third = trained()
        saved = read(directory, "model", third.module)
        shapes = plain["shapes"]
        if saved.get("steps") != 1 or set(saved.get("state", {})) != set(shapes):
            return (f"optimizer_state_from_checkpoint gave steps {saved.get('steps')!r} and states of "
                    f"{len(saved.get('state', {}))} parameters; expected 1 and the {len(shapes)} trainable ones by name")
        wrong = [name for name, per in saved["state"].items()
                 if any(torch.is_tensor(v) and v.dim() and tuple(v.shape) != shapes[name] for v in per.values())]
        if wrong:
            return f"optimizer_state_from_checkpoint's states of {wrong[:3]} are not whole (their parameters' shapes)"
        if not hasattr(backend, "load_full_state") or after is None:
            return None
        backend.load_full_state(third, backend_class.full_state_from_checkpoint(directory, "model", third.module), saved)
        with warnings.catch_warnings():  # "lr_scheduler.step() before optimizer.step()": step 1 was taken elsewhere
            warnings.simplefilter("ignore", UserWarning)
            third.lr_scheduler.step()
        train_step(third, 1)
        problem = _far(third.state_dict(), after, tolerance)
        return f"step 2 after load_full_state (step 1's checkpoint, through the neutral state): {problem}" if problem else None

    check_picklable(BACKEND, backend_class)
    first_failure(BACKEND, "accumulation", [("batch_size 4, micro_batch_size 2, one rank", accumulation)])
    first_failure(BACKEND, "training steps equal plain torch", [(f"AdamW lr {LR}, clip {MAX_NORM}, 2 steps", steps)])
    first_failure(BACKEND, "learning_rate", [("a constant schedule", learning_rate)])
    first_failure(BACKEND, "full_tensors and full_shape", [("three state-dict entries", full_tensors)])
    first_failure(BACKEND, "evaluated", [("a forward of the untrained model", evaluated)])
    first_failure(BACKEND, "device", [("the trained model's .device", device),
                                      ("a step and an evaluated forward on a simulated accelerator, inputs on .device",
                                       on_its_device)])
    first_failure(BACKEND, "checkpoints", [("saved after step 1, resumed for step 2", resume)])


class TrainingBackendKit(ContractProperties, ComponentKit):
    """``component``: the backend class. Uses the ``tiny_causal_lm_path`` fixture of ``rlhf.testing``."""

    kind = ComponentKind.TRAINING_BACKEND
    #: how far the weights after the backend's steps may be from plain torch's (check_training_backend)
    weight_tolerance = WEIGHT_TOLERANCE
    contract_properties = ("accumulation", "training steps equal plain torch", "learning_rate", "full_tensors and full_shape", "evaluated", "device", "checkpoints",)

    def test_picklable(self) -> None:
        check_picklable(self.kind.label, self.component)

    @not_collected
    def test_contract(self, tiny_causal_lm_path: Any) -> None:
        check_training_backend(self.component, tiny_causal_lm_path, kit_config(self.run_config()), self.weight_tolerance)

    def test_plan_memory(self) -> None:
        check_backend_plan(self.component, self.run_config())

    def test_plan_remedies(self) -> None:
        check_backend_remedies(self.component, self.run_config())
