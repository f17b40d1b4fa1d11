"""``--ds.use_universal_ckpt``: resume a DeepSpeed checkpoint on a different number of ranks.

A ZeRO checkpoint holds each rank's optimizer shard, so it loads only into as many ranks as
wrote it. DeepSpeed's universal format stores every parameter whole (fp32 weights and Adam
moments), from which any number of ranks takes its shards. With the flag, a resume converts
the checkpoint's ``<tag>/`` states once into ``<tag>_universal/`` next to them (DeepSpeed's
``ds_to_universal``, on rank 0 while the others wait) and loads that; engines are built with
``checkpoint.load_universal`` so DeepSpeed reads it. Saves are ordinary ZeRO checkpoints, so
the flag costs nothing until a resume (then one conversion: a read and a write of the states).
Without the flag, a resume on another number of data-parallel ranks than wrote the states converts
alike (:func:`rlhf_plugin_deepspeed.checkpoint.load_engine` turns ``load_universal`` on for that load).
"""

from __future__ import annotations

import argparse
import logging
import shutil
import time
from pathlib import Path

log = logging.getLogger("rlhf.checkpoint")

SUFFIX = "_universal"


def universal_dir(directory: Path, tag: str) -> Path:
    return directory / f"{tag}{SUFFIX}"


def convert(directory: Path, tag: str, why: str) -> str:
    """Make ``directory/<tag>_universal`` from ``directory/<tag>`` on rank 0 (every rank calls this;
    they meet at a barrier) and return the tag to load. Rank 0 logs one line: ``why``, and what was converted in
    how long (or that an earlier resume converted it)."""
    import torch.distributed as dist

    target = universal_dir(directory, tag)
    if not dist.is_initialized() or dist.get_rank() == 0:
        if (target / "zero").is_dir():
            log.warning("checkpoint %s (%s): loading the universal form an earlier resume converted, %s",
                        directory / tag, why, target)
        else:
            from deepspeed.checkpoint import ds_to_universal

            started = time.perf_counter()

            staging = target.with_name(f".staging-{target.name}")
            shutil.rmtree(staging, ignore_errors=True)
            ds_to_universal.main(argparse.Namespace(
                input_folder=str(directory / tag), output_folder=str(staging), num_extract_workers=1,
                num_merge_workers=1, keep_temp_folder=False, strict=True,
                inject_missing_state=True))  # our engines do not write Megatron's universal-info block
            staging.rename(target)
            log.warning("checkpoint %s (%s): converted to DeepSpeed's universal form %s in %.1f s", directory / tag, why,
                        target, time.perf_counter() - started)
    if dist.is_initialized():
        dist.barrier()
    return target.name
