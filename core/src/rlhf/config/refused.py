"""The options this runtime accepts for OpenRLHF compatibility but refuses to run with.

Every option of every trainer's config is either read by the runtime or a plugin, or listed
in :data:`REFUSED`: setting a refused option to anything but its default stops the run at
parse time with one ``rlhf: error:`` line that names the option and says why
(``tests/test_option_coverage.py`` keeps it so). ``--help`` marks refused options.

The table is plain data: an option that becomes real leaves it by deleting its line.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from rlhf.config.base import ConfigError

#: Ray 2.60's ray.util.collective: its gloo group is torch's default process group (or a subgroup of it),
#: which DeepSpeed already holds in the actor ranks with the engines outside it; its NCCL group needs cupy.
_WEIGHT_SYNC = ("weight sync through Ray collectives cannot run here: Ray's gloo collective group is built on torch's "
                "default process group, which the actor's DeepSpeed ranks already use without the engines, and its NCCL "
                "group needs cupy; --vllm.sync_backend gloo or nccl does the same broadcast over a group of its own")

#: (trainer family, dotted option) -> why it is refused. The family is "ppo", "supervised" (a config
#: class names its own in ``trainer_family``, which also picks rlhf-plugin-openrlhf-compat's table of
#: old flag spellings) or "*" for both. Delete a line when the option becomes real.
REFUSED: dict[tuple[str, str], str] = {
    ("ppo", "vllm.sync_with_ray"): _WEIGHT_SYNC,
    ("supervised", "ds.enable_sleep"): "sleep mode frees devices for colocated rollout engines; supervised training has none",
    ("ppo", "local_rank"): "Ray places each rank on its device; --local_rank is for the launchers of the supervised trainers",
    ("*", "use_ms"): "models cannot be fetched from ModelScope: download the model and pass its local directory",
}


def refusals(config_class: type[BaseModel]) -> dict[str, str]:
    """dotted option -> reason, for the options of ``config_class`` that this runtime refuses."""
    family = getattr(config_class, "trainer_family", None)
    return {dotted: reason for (trainers, dotted), reason in REFUSED.items()
            if trainers in ("*", family) and _field_default(config_class, dotted) is not _ABSENT}


def refused_settings(config: BaseModel) -> list[str]:
    """``"--option value: why"`` for every refused option ``config`` sets to a non-default value."""
    found = []
    for dotted, reason in refusals(type(config)).items():
        value = _value(config, dotted)
        if value != _field_default(type(config), dotted):
            found.append(f"--{dotted} {_shown(value)}: {reason}")
    return found


def refuse(config: BaseModel) -> None:
    """Raise one :class:`ConfigError` naming every refused option ``config`` sets to a non-default value."""
    if found := refused_settings(config):
        raise ConfigError("; ".join(found) + (" (leave it at its default)" if len(found) == 1 else
                                              " (leave them at their defaults)"))


_ABSENT = object()


def _field_default(model: type[BaseModel], dotted: str) -> Any:
    """The default of ``model``'s field at ``dotted`` (a section's default instance counts), or ``_ABSENT``."""
    *sections, leaf = dotted.split(".")
    node: Any = model
    instance: Any = None
    for name in sections:
        field = node.model_fields.get(name)
        if field is None:
            return _ABSENT
        instance = getattr(instance, name) if instance is not None else field.get_default(call_default_factory=True)
        node = type(instance)
    if leaf not in node.model_fields:
        return _ABSENT
    if instance is not None:
        return getattr(instance, leaf)
    return node.model_fields[leaf].get_default(call_default_factory=True)


def _value(config: BaseModel, dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def _shown(value: Any) -> str:
    return "(set)" if value is True else str(value)
