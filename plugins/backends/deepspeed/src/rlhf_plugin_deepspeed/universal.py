"""``--ds.use_universal_ckpt``: resume a DeepSpeed checkpoint on a different number of ranks.

A ZeRO checkpoint holds each rank's optimizer shard, so it loads only into as many ranks as
wrote it. DeepSpeed's universal format stores every parameter whole (fp32 weights and Adam
moments), from which any number of ranks takes its shards. With the flag, a resume converts
the checkpoint's ``<tag>/`` states once into ``<tag>_universal/`` next to them (DeepSpeed's
``ds_to_universal``, on rank 0 while the others wait) and loads that; engines are built with
``checkpoint.load_universal`` so DeepSpeed reads it. Saves are ordinary ZeRO checkpoints, so
the flag costs nothing until a resume (then one conversion: a read and a write of the states).
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

SUFFIX = "_universal"


def universal_dir(directory: Path, tag: str) -> Path:
    return directory / f"{tag}{SUFFIX}"


def convert(directory: Path, tag: str) -> str:
    """Make ``directory/<tag>_universal`` from ``directory/<tag>`` on rank 0 (every rank calls this;
    they meet at a barrier) and return the tag to load."""
    import torch.distributed as dist

    target = universal_dir(directory, tag)
    if not dist.is_initialized() or dist.get_rank() == 0:
        if not (target / "zero").is_dir():
            from deepspeed.checkpoint import ds_to_universal

            staging = target.with_name(f".staging-{target.name}")
            shutil.rmtree(staging, ignore_errors=True)
            ds_to_universal.main(argparse.Namespace(
                input_folder=str(directory / tag), output_folder=str(staging), num_extract_workers=1,
                num_merge_workers=1, keep_temp_folder=False, strict=True,
                inject_missing_state=True))  # our engines do not write Megatron's universal-info block
            staging.rename(target)
    if dist.is_initialized():
        dist.barrier()
    return target.name
