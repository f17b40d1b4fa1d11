"""Value checks shared by every trainer's config: sizes, global batches, sampling probabilities.

Each check raises :class:`ConfigError` naming the flag and the fix, so a wrong number
stops the run at start with one line instead of a division by zero or a DeepSpeed
assertion minutes later.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rlhf.config.base import ConfigError

#: The plugin API (docs/plugin-api.md); the module's other names may change in any release.
__all__ = ["check_4bit", "check_global_batch", "check_optimizer", "require_positive"]

if TYPE_CHECKING:
    from rlhf.config.base import Section


def require_positive(config: Section, *dotted: str) -> None:
    """Every ``section.field`` in ``dotted`` holds an integer >= 1."""
    for path in dotted:
        value: Any = config
        for part in path.split("."):
            value = getattr(value, part)
        if value is not None and value < 1:
            raise ConfigError(f"--{path} must be at least 1 (got {value})")


def check_global_batch(batch_size: int, micro_batch_size: int, ranks: int, ranks_source: str) -> None:
    """DeepSpeed's rule: the global batch is micro-batch x accumulation steps x data-parallel ranks."""
    per_step = micro_batch_size * ranks
    if batch_size % per_step:
        raise ConfigError(
            f"--train.batch_size {batch_size} is not divisible by --train.micro_batch_size {micro_batch_size} x "
            f"{ranks} data-parallel rank(s) ({ranks_source}) = {per_step}: choose a multiple of {per_step}")


def parse_probabilities(spec: str | None, count: int, flag: str, datasets_flag: str) -> list[float]:
    """``"0.7,0.3"`` for ``count`` datasets: numbers >= 0 that sum to 1 (equal shares when unset)."""
    if not spec:
        return [1.0 / count] * count
    values = [part.strip() for part in spec.split(",")]
    if len(values) != count:
        raise ConfigError(f"{flag} has {len(values)} value(s) for {count} dataset(s) in {datasets_flag}: give one per dataset")
    try:
        probabilities = [float(value) for value in values]
    except ValueError:
        raise ConfigError(f"{flag} {spec!r}: every value must be a number, e.g. 0.7,0.3") from None
    if any(not math.isfinite(p) or p < 0 for p in probabilities):
        raise ConfigError(f"{flag} {spec!r}: probabilities must be finite and >= 0")
    total = sum(probabilities)
    if abs(total - 1.0) > 1e-6:
        raise ConfigError(f"{flag} {spec!r} sums to {total:g}; probabilities must sum to 1")
    return probabilities


def check_optimizer(optimizer: Any, section: Any, flag: Callable[[str], str]) -> None:
    """Run the optimizer factory's optional ``check_config(section, flag)`` (it raises :class:`ConfigError`
    or warns); ``flag("max_norm")`` names a section field as the user spells it (``--actor.max_norm``)."""
    check = getattr(optimizer, "check_config", None)
    if check is not None:
        check(section, flag)


def check_4bit(ds: Any, devices_here: bool = True) -> None:
    """``--ds.load_in_4bit`` needs a GPU, LoRA adapters to train, and ZeRO below 3: a clear error otherwise.
    ``devices_here``: whether this process sees the devices the model will load on; a driver that joins a Ray
    cluster (``RAY_ADDRESS``) may have no GPU while the cluster has, and the ranks check it as they load."""
    import torch

    if devices_here and not torch.cuda.is_available():
        raise ConfigError("--ds.load_in_4bit needs a CUDA GPU (bitsandbytes 4-bit kernels); "
                          "drop the flag on CPU machines (plain --ds.lora.rank still works)")
    if ds.lora.rank <= 0:
        raise ConfigError("--ds.load_in_4bit trains LoRA adapters on a frozen 4-bit base: set --ds.lora.rank > 0")
    if ds.zero_stage == 3:
        raise ConfigError("--ds.load_in_4bit does not work with --ds.zero_stage 3 (4-bit weights cannot be partitioned)")


#: the names ``--train.colocate`` joins with '+'
COLOCATED_NAMES = ("actor", "ref", "critic", "reward", "engines")


def colocation_sets(entries: list[str] | None) -> list[list[str]]:
    """``--train.colocate a+b c+d`` (``entries``) as ``[["a", "b"], ["c", "d"]]``; a :class:`ConfigError` for an
    unknown name, a name given twice, or a set of one."""
    sets, seen = [], set()
    for entry in entries or []:
        names = [name.strip() for name in entry.split("+") if name.strip()]
        unknown = [name for name in names if name not in COLOCATED_NAMES]
        if unknown or len(names) < 2:
            raise ConfigError(f"--train.colocate {entry}: give two or more of {', '.join(COLOCATED_NAMES)} joined by '+'"
                              + (f" ({', '.join(unknown)} is not one)" if unknown else ""))
        if seen & set(names):
            raise ConfigError(f"--train.colocate: {', '.join(sorted(seen & set(names)))} is in two sets; join them into one")
        seen |= set(names)
        sets.append(names)
    return sets


def engines_colocated_with(train: Any, roles: Any = ("actor", "ref", "critic", "reward")) -> str | None:
    """The model group whose GPUs the rollout engines share, or None where they have GPUs of their own: the actor with
    ``--train.colocate_all``, else the first of ``roles`` in the ``--train.colocate`` set that holds ``engines``."""
    if getattr(train, "colocate_all", False):
        return "actor"
    for names in colocation_sets(getattr(train, "colocate", None)):
        if "engines" in names:
            return next((name for name in names if name != "engines" and name in roles), None)
    return None
