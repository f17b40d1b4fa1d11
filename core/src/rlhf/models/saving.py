"""Writing a trained model as a Hugging Face model directory: the last step of every trainer (and of
``--critic.save_value_network``)."""

from __future__ import annotations

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
        with published(output_dir, "model") as staging:
            module.save_pretrained(staging, state_dict=state)
            if is_peft(module):
                base.config.save_pretrained(staging)  # the base config (RM statistics) travels with the adapter
            tokenizer.save_pretrained(staging)
    dist.barrier()
