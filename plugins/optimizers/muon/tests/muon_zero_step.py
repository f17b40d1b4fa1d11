"""Two optimizer steps of the tiny causal LM with ``--actor.optim muon`` under DeepSpeed ZeRO-STAGE on gloo, for
each STAGE in turn in the same processes (one interpreter, import and process group for all of them).

Usage: python muon_zero_step.py MODEL_DIR OUT_DIR STAGE...  (RANK/WORLD_SIZE/MASTER_* from the caller).
Every rank trains on its own batch; rank 0 saves the full parameters before and after each step
to OUT_DIR/params-STAGE.pt, with the two batches, for the test to replay independently.
"""

import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import torch  # noqa: E402
from rlhf_plugin_deepspeed.backend import DeepSpeedBackend, full_state_dict, zero3_context  # noqa: E402
from rlhf_plugin_deepspeed.config import optimizer_train_config  # noqa: E402
from rlhf_plugin_muon.optim import Muon  # noqa: E402

from rlhf.models.loading import load_causal_lm  # noqa: E402
from rlhf.testing.conformance import ppo_config  # noqa: E402

model_dir, out_dir, stages = sys.argv[1], sys.argv[2], [int(stage) for stage in sys.argv[3:]]
cfg = ppo_config()
DeepSpeedBackend(cfg).init_distributed()
rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
cfg.ds.param_dtype = "fp32"
cfg.train.micro_batch_size, cfg.train.batch_size = 2, 2 * world
cfg.actor.max_norm = 0.0
cfg.actor.muon.lr, cfg.actor.adam.lr, cfg.actor.adam.weight_decay = 0.01, 1e-3, 0.1
batches = torch.randint(10, 200, (world, 2, 160), generator=torch.Generator().manual_seed(0))
for stage in stages:
    cfg.ds.zero_stage = stage
    ds_config = optimizer_train_config(cfg, Muon(), cfg.actor, world)
    context = zero3_context(ds_config)
    model = load_causal_lm(model_dir, torch.float32, "eager")
    engine, *_ = deepspeed.initialize(model=model, model_parameters=[p for p in model.parameters() if p.requires_grad],
                                      config=ds_config)
    states = [full_state_dict(engine.module)]
    for _ in range(2):
        loss = engine(input_ids=batches[rank], labels=batches[rank]).loss
        engine.backward(loss)
        engine.step()
        states.append(full_state_dict(engine.module))
    if rank == 0:
        torch.save({"states": states, "batches": batches, "zero_stage": engine.zero_optimization_stage(),
                    "reduce_scatter": ds_config["zero_optimization"].get("reduce_scatter"),
                    "optimizer": type(engine.optimizer).__name__}, os.path.join(out_dir, f"params-{stage}.pt"))
# both ranks leave the gloo group together: one torn down at interpreter exit while its peer still talks aborted a
# rank with "terminate called without an active exception" (once in a full suite)
torch.distributed.barrier()
torch.distributed.destroy_process_group()
