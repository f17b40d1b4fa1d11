"""A simulated accelerator: device mistakes that only a GPU would show, made visible on a CPU machine.

On a CPU machine every tensor sits on the one device, so a batch built on the CPU and never moved to the
model's device trains without complaint, then fails on the first GPU ("Expected all tensors to be on the
same device, but got index is on cpu, different from other tensors on cuda:0"). Here a model is put on a
pretend device, ``meta`` by name, while its tensors stay in host memory so it still computes:

* :func:`put_on_accelerator` marks a model (a :class:`rlhf.components.TrainedModel`, or anything with
  ``.module`` and ``.device``): its ``device`` and its module's ``device`` become :data:`SIMULATED`, and
  every forward of the module (or of any submodule called directly, as a value head is) refuses a tensor
  input that was not moved there.
* Inside :func:`simulated_accelerator` (a torch function mode, per thread), ``x.to(device)``,
  ``torch.tensor(…, device=device)`` and every factory given that device return host tensors marked as
  being on it (:class:`OnAccelerator`); ``.cpu()`` unmarks, results of marked inputs stay marked. An op
  that mixes a marked tensor with an unmarked CPU tensor of one or more dimensions raises as CUDA would
  (0-dimensional CPU tensors mix, as on a GPU); so does ``.numpy()`` of a marked tensor. The model's own
  parameters are neither: the optimizer meets them with their gradients, as on the device.

What it does not simulate: device memory, streams, and collectives (gloo still reduces host tensors).

Used by the training-backend and rollout-engine conformance kits, and by whole runs under
:class:`SimulatedBackend`: the ``simulated-deepspeed`` / ``simulated-fsdp2`` training backends that the plugin
:mod:`rlhf.testing.simulated_backends` registers (``--plugins rlhf.testing.simulated_backends --train.backend
simulated-deepspeed``), or :func:`simulated` around any backend class.
"""

from __future__ import annotations

import contextlib
import importlib
import threading
from collections.abc import Iterator
from typing import Any, ClassVar

import torch
from torch.overrides import TorchFunctionMode

from rlhf.components import build

__all__ = ["SIMULATED", "OnAccelerator", "SimulatedAcceleratorMode", "SimulatedBackend", "put_on_accelerator",
           "simulated", "simulated_accelerator"]

#: the device a simulated model reports; ``meta`` so that nothing outside the simulation can allocate on it
SIMULATED = torch.device("meta")

#: the message every refusal starts with: CUDA's own, so a test reads the same as the GPU failure
MISMATCH = "Expected all tensors to be on the same device, but found at least two devices, meta (simulated accelerator) and cpu!"


class OnAccelerator(torch.Tensor):
    """A host tensor that stands for one on the simulated device (made by :class:`SimulatedAcceleratorMode`)."""

    __torch_function__ = torch._C._disabled_torch_function_impl  # the mode does all the work


def _is_simulated(device: Any) -> bool:
    if isinstance(device, OnAccelerator):
        return True
    if isinstance(device, (str, torch.device)):
        return torch.device(device).type == SIMULATED.type
    return False


def _tensors(values: Any) -> Iterator[torch.Tensor]:
    """The tensors among call arguments, one level into lists, tuples and dicts (``torch.cat([…])``)."""
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, (list, tuple)):
            yield from (v for v in value if isinstance(v, torch.Tensor))
        elif isinstance(value, dict):
            yield from (v for v in value.values() if isinstance(v, torch.Tensor))


def mark(value: Any) -> Any:
    """``value`` with every tensor in it (nested in tuples, lists, dicts, HF outputs) marked as on the device."""
    if isinstance(value, torch.Tensor):
        return value if isinstance(value, OnAccelerator) else value.as_subclass(OnAccelerator)
    if isinstance(value, dict):  # an HF ModelOutput is one: keep its class and attributes
        for key in list(value.keys()):
            value[key] = mark(value[key])
        return value
    if isinstance(value, list):
        return [mark(v) for v in value]
    if isinstance(value, tuple):
        items = [mark(v) for v in value]
        return tuple(items) if type(value) is tuple else type(value)(items)  # torch.return_types keep their type
    return value


def unmark(value: Any) -> Any:
    """``value`` with its marked tensors as plain host tensors again (the same storage and autograd history)."""
    if isinstance(value, OnAccelerator):
        return value.as_subclass(torch.Tensor)
    if isinstance(value, list):
        return [unmark(v) for v in value]
    if isinstance(value, tuple) and type(value) is tuple:
        return tuple(unmark(v) for v in value)
    if isinstance(value, dict) and type(value) is dict:
        return {k: unmark(v) for k, v in value.items()}
    return value


def _target(func: Any, args: tuple, kwargs: dict[str, Any]) -> Any:
    """Where a call puts its result: the device it names (``to``, ``device=``), ``"cpu"`` for ``.cpu()``, else None."""
    name = getattr(func, "__name__", "")
    if name == "cpu":
        return "cpu"
    if "device" in kwargs:
        return kwargs["device"]
    if name == "to":
        for value in args[1:]:
            if isinstance(value, (str, torch.device)) or isinstance(value, torch.Tensor):
                return value
    return None


class SimulatedAcceleratorMode(TorchFunctionMode):
    """The torch function mode behind :func:`simulated_accelerator` (see the module's docstring)."""

    #: calls that take tensors on two devices on a GPU too: cross-device copies and indexing by CPU indices
    MIXING = frozenset({"copy_", "__getitem__", "index_select", "__set__"})

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = kwargs or {}
        if getattr(func, "__self__", None) is torch.Tensor.device:  # the ``.device`` property
            return SIMULATED if isinstance(args[0], OnAccelerator) else func(*args, **kwargs)
        target = _target(func, args, kwargs)
        if target is not None:
            if not _is_simulated(target):
                return unmark(func(*unmark(args), **kwargs)) if _is_simulated_input(args) else func(*args, **kwargs)
            if "device" in kwargs:
                kwargs = {**kwargs, "device": "cpu"}
            args = tuple("cpu" if i and _is_simulated(a) else a for i, a in enumerate(args))
            return mark(func(*args, **kwargs))
        inputs = list(_tensors(args)) + list(_tensors(kwargs.values()))
        if not any(isinstance(t, OnAccelerator) for t in inputs):
            return func(*args, **kwargs)
        name = getattr(func, "__name__", str(func))
        if name == "numpy":
            raise TypeError("can't convert meta (simulated accelerator) device type tensor to numpy. Use Tensor.cpu() "
                            "to copy the tensor to host memory first.")
        if name not in self.MIXING:
            stray = next((t for t in inputs if _on_host(t)), None)
            if stray is not None:
                raise RuntimeError(f"{MISMATCH} ({name}: a CPU tensor of shape {tuple(stray.shape)} met one on the "
                                   "model's device; build it with device=<the model's device> or move it with .to())")
        result = func(*args, **kwargs)
        return result if name in ("item", "tolist", "__bool__", "__float__", "__int__") else mark(result)


def _on_host(tensor: torch.Tensor) -> bool:
    """A plain CPU tensor with a dimension (0-dimensional ones mix with device tensors, as on a GPU), not a parameter."""
    return (not isinstance(tensor, OnAccelerator) and tensor.device.type == "cpu" and tensor.dim() > 0
            and not isinstance(tensor, torch.nn.Parameter) and id(tensor) not in _resident)


def _is_simulated_input(args: tuple) -> bool:
    return any(isinstance(a, OnAccelerator) for a in args)


#: ids of the buffers of modules put on the simulated device (parameters are recognised by their type)
_resident: set[int] = set()
_depth = threading.local()


@contextlib.contextmanager
def simulated_accelerator() -> Iterator[SimulatedAcceleratorMode]:
    """Moves to :data:`SIMULATED` mark tensors instead of emptying them, in this thread, inside the block."""
    with SimulatedAcceleratorMode() as mode:
        yield mode


def enter_for_process() -> None:
    """Enter the simulation in this thread for the rest of the process (a run's worker under a simulated backend)."""
    if not any(isinstance(m, SimulatedAcceleratorMode) for m in torch.overrides._get_current_function_mode_stack()):
        SimulatedAcceleratorMode().__enter__()


def _check_inputs(module: torch.nn.Module, args: tuple, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]] | None:
    level = getattr(_depth, "level", 0)
    _depth.level = level + 1
    if level:  # inside the simulated model's forward everything is on its device already
        return None
    for name, value in [*((f"argument {i}", a) for i, a in enumerate(args)), *kwargs.items()]:
        for tensor in _tensors([value]):
            if _on_host(tensor):
                _depth.level = 0
                raise RuntimeError(f"{MISMATCH} ({type(module).__name__}.forward: input {name!r} of shape "
                                   f"{tuple(tensor.shape)} is on the CPU, the model on its device; move it to the "
                                   "model's .device first)")
    return unmark(args), {key: unmark(value) for key, value in kwargs.items()}


def _mark_outputs(module: torch.nn.Module, args: tuple, output: Any) -> Any:
    _depth.level = max(getattr(_depth, "level", 1) - 1, 0)
    return mark(output) if _depth.level == 0 and output is not None else None


def put_on_accelerator(model: Any) -> Any:
    """Put ``model`` (with ``.module`` and ``.device``) on the simulated device, in place; returns it.

    Its ``device`` attribute and its module's ``device`` property report :data:`SIMULATED`; every
    submodule's forward refuses CPU inputs (the outermost call checks, then computes on the host) and
    marks its outputs as on the device."""
    module = model.module
    cls = type(module)
    module.__class__ = type(cls.__name__, (cls,), {"device": property(lambda self: SIMULATED),
                                                    "__module__": cls.__module__})
    for submodule in module.modules():
        submodule.register_forward_pre_hook(_check_inputs, with_kwargs=True)
        submodule.register_forward_hook(_mark_outputs, always_call=True)
    _resident.update(id(buffer) for buffer in module.buffers())
    model.device = SIMULATED
    return model


class SimulatedBackend:
    """A :class:`rlhf.components.TrainingBackend` that builds ``inner`` and puts each of its models on the
    simulated device; everything else is the inner backend's. Each process that builds one enters the
    simulation for good (a run's rank; a test that builds one in its own process should use a subprocess)."""

    #: the wrapped backend class, or its ``"module:attr"`` (imported when first used)
    inner: ClassVar[Any]

    @classmethod
    def inner_class(cls) -> type:
        if isinstance(cls.inner, str):
            module, attr = cls.inner.split(":")
            cls.inner = getattr(importlib.import_module(module), attr)
        return cls.inner

    @classmethod
    def check_config(cls, config: Any) -> None:
        check = getattr(cls.inner_class(), "check_config", None)
        if check is not None:
            check(config)

    @classmethod
    def preload(cls) -> None:
        preload = getattr(cls.inner_class(), "preload", None)
        if preload is not None:
            preload()

    @classmethod
    def sharded_reason(cls, config: Any) -> str | None:
        reason = getattr(cls.inner_class(), "sharded_reason", None)
        return reason(config) if reason is not None else None

    @classmethod
    def tensor_parallel_reason(cls, config: Any) -> str | None:
        reason = getattr(cls.inner_class(), "tensor_parallel_reason", None)
        return reason(config) if reason is not None else None

    @classmethod
    def from_config(cls, config: Any) -> SimulatedBackend:
        return cls(config)

    def __init__(self, config: Any) -> None:
        enter_for_process()
        self.backend = build(self.inner_class(), config)

    def init_distributed(self) -> None:
        self.backend.init_distributed()

    def trained(self, *args: Any, **kwargs: Any) -> Any:
        return put_on_accelerator(self.backend.trained(*args, **kwargs))

    def evaluated(self, *args: Any, **kwargs: Any) -> Any:
        return put_on_accelerator(self.backend.evaluated(*args, **kwargs))

    def gathered(self, module: Any) -> Any:
        return self.backend.gathered(module)


def simulated(backend_class: type) -> type:
    """``backend_class`` with every model it builds on the simulated device."""
    return type(f"Simulated{backend_class.__name__}", (SimulatedBackend,), {"inner": backend_class})


class SimulatedDeepSpeed(SimulatedBackend):
    inner = "rlhf_plugin_deepspeed.backend:DeepSpeedBackend"


class SimulatedFSDP2(SimulatedBackend):
    inner = "rlhf_plugin_fsdp2.backend:FSDP2Backend"
