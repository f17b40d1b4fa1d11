"""``rlhf plan``: where every model of a run goes and what each GPU must hold, before a GPU is touched.

Public for plugins (docs/plugin-api.md): a training backend's optional classmethod
``plan_memory(config, model: PlannedModel) -> list[MemoryPart]``, a rollout engine's
``plan_memory(config, shape: ModelShape, gpu_memory: int | None) -> list[MemoryPart]`` and an optimizer's
``plan_state_bytes(shape: ModelShape, trainable: int) -> int`` answer with the helpers below, and a trainer's
``plan_groups(config, registry) -> RunGroups`` names its model groups. Where a plan does not fit, a training backend
and a rollout engine may offer changes of their own flags with the optional classmethod
``plan_remedies(config, run: RemedyContext) -> list[Remedy]``. All run in the CLI process, once per
``rlhf plan`` or ``rlhf train``; for a plan that does not fit, ``plan_remedies`` once more and the rest once per change
tried. docs/plan.md.
"""

from rlhf.planning.groups import ModelGroup, RunGroups
from rlhf.planning.parts import (
    MemoryPart,
    PlannedModel,
    activation_bytes,
    dtype_bytes,
    format_bytes,
    parse_bytes,
    zero_model_states,
)
from rlhf.planning.remedies import REMEDY_COSTS, Remedy, RemedyContext
from rlhf.planning.shapes import ModelShape, model_shape

__all__ = ["REMEDY_COSTS", "MemoryPart", "ModelGroup", "ModelShape", "PlannedModel", "Remedy", "RemedyContext", "RunGroups",
           "activation_bytes", "dtype_bytes", "format_bytes", "model_shape", "parse_bytes", "zero_model_states"]
