"""The first change that makes a plan fit: each candidate is a few flags, applied to a copy of the config and planned
again; a candidate the run's components refuse (their ``check_config``) or that changes nothing is skipped.

The order is the cost to the run: share GPUs (colocation), move optimizer states to the CPU, split the model states
further (ZeRO-3), recompute activations, shrink the micro-batch, free memory between phases (sleep), and last
more GPUs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlhf.config.training_backend import check_backend_config
from rlhf.errors import ConfigError
from rlhf.runtime.cluster.placement import COLOCATIONS

#: how many times more GPUs for the model groups the last candidates try
GROWTH = (2, 4, 8, 16)


def candidates(config: Any) -> list[dict[str, Any]]:
    """Flag changes to try, in order (dotted names as on the command line)."""
    train = config.train
    tried: list[dict[str, Any]] = [{f"train.{name}": True for name in names} for names in COLOCATIONS
                                   if hasattr(train, names[0])]
    tried += [{"ds.adam_offload": True}, {"ds.zero_stage": 3}, {"ds.zero_stage": 3, "ds.adam_offload": True}]
    checkpointed = [f"{role}.gradient_checkpointing_enable" for role in ("actor", "train")
                    if hasattr(getattr(config, role, None), "gradient_checkpointing_enable")]
    tried += [dict.fromkeys(checkpointed, True)] if checkpointed else []
    size = train.micro_batch_size // 2
    while size >= 1:
        tried.append({"train.micro_batch_size": size})
        size //= 2
    if getattr(train, "colocate_all", False) and hasattr(config, "vllm"):
        tried.append({"vllm.enable_sleep": True, "ds.enable_sleep": True})
    groups = [role for role in ("actor", "critic", "ref", "reward", "model") if hasattr(getattr(config, role, None), "num_nodes")]
    tried += [{f"{role}.num_nodes": getattr(config, role).num_nodes * factor for role in groups} for factor in GROWTH]
    return [change for change in tried if any(_get(config, key) != value for key, value in change.items())]


def first_fitting_change(config: Any, registry: Any, cluster: Any, replan: Callable[[Any, Any], Any],
                         cluster_for: Callable[[Any], Any]) -> str | None:
    """The flags of the first candidate with which the plan fits, as typed (``--ds.zero_stage 3``), or None.
    ``replan(config, cluster)`` plans a changed config; ``cluster_for(config)`` is a cluster of the GPUs it asks for
    (for the candidates that add GPUs)."""
    for change in candidates(config):
        grows = any(key.endswith(".num_nodes") for key in change)
        try:
            changed = changed_config(config, change)
            check_backend_config(changed, registry)
            on = cluster_for(changed) if grows else cluster
            plan = replan(changed, on)
        except ConfigError:
            continue
        if plan.fits is not False:  # fits, or can be placed where the memory is unknown
            flags = " ".join(f"--{key}" if value is True else f"--{key} {value}" for key, value in change.items())
            return flags + (f" ({sum(on.nodes):g} GPUs)" if grows else "")
    return None


def changed_config(config: Any, change: dict[str, Any]) -> Any:
    """A validated copy of ``config`` with the dotted ``change`` applied."""
    tree = config.model_dump()
    for key, value in change.items():
        *path, last = key.split(".")
        node = tree
        for part in path:
            node = node[part]
        node[last] = value
    return type(config).model_validate(tree)


def _get(config: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        config = getattr(config, part, None)
    return config
