"""Writing a trained model as a Hugging Face model directory: the last step of every trainer (and of
``--critic.save_value_network``)."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlhf.models.lora import is_peft
from rlhf.records.checkpoints import published


def save_final(model: Any, tokenizer: Any, output_dir: Path, rank: int, config_updates: dict[str, Any]) -> None:
    """Write the trained model (a :class:`rlhf.components.TrainedModel`; or only its LoRA adapter) to
    ``output_dir``; every rank calls this.

    Files go through a staging dir (:func:`rlhf.records.checkpoints.published`), so a crash or a
    full disk never leaves a half-written weight file under its final name.
    """
    import torch.distributed as dist

    module = model.module
    state = model.state_dict()
    if rank == 0:
        base = module.get_base_model() if is_peft(module) else module
        for key, value in config_updates.items():
            setattr(base.config, key, value)
        with published(output_dir, "model") as staging, without_deepspeed_import():
            module.save_pretrained(staging, state_dict=state)
            if is_peft(module):
                base.config.save_pretrained(staging)  # the base config (RM statistics) travels with the adapter
            tokenizer.save_pretrained(staging)
    dist.barrier()


@contextlib.contextmanager
def without_deepspeed_import() -> Iterator[None]:
    """Around ``save_pretrained`` in a process that has not imported DeepSpeed: transformers unwraps the model through
    accelerate, which imports ``deepspeed`` (seconds, and its accelerator probe in the log) only to ask whether the
    model is a ``DeepSpeedEngine``. No object can be one while the module was never imported, so the question is
    answered "no" without the import; a run on a backend other than DeepSpeed then never loads it."""
    if "deepspeed" in sys.modules:
        yield
        return
    import accelerate.utils.other as unwrapping

    asks = unwrapping.is_deepspeed_available
    unwrapping.is_deepspeed_available = lambda: False
    try:
        yield
    finally:
        unwrapping.is_deepspeed_available = asks
