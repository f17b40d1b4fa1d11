"""ParameterEMA under DeepSpeed ZeRO-3 with the ranks of a launcher (gloo on CPU), against an independent EMA.

Usage: python -m torch.distributed.run --nproc_per_node N ema_zero3.py MODEL_DIR BETA OUT ; rank 0 prints JSON:
the largest difference between the EMA the saves see and an EMA of the gathered full weights kept
here step by step, and whether the live weights came back after the save. Every rank saves its EMA share
under OUT/actor_ema (as a checkpoint does) and rank 0 the whole average as OUT/averaged.pt, for a resume
of that EMA on another number of ranks.
"""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import deepspeed  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from rlhf_plugin_deepspeed.backend import DeepSpeedBackend, full_state_dict  # noqa: E402
from rlhf_plugin_deepspeed.ema import ParameterEMA  # noqa: E402
from rlhf_supervised.config import SupervisedConfig  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.integrations import HfDeepSpeedConfig  # noqa: E402

DeepSpeedBackend(SupervisedConfig()).init_distributed()
beta = float(sys.argv[2])
config = {
    "train_micro_batch_size_per_gpu": 2,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},  # shard every tensor, small ones too
    "bf16": {"enabled": False},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True}},
}
keep_alive = HfDeepSpeedConfig(config)
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
sharded = all(hasattr(p, "ds_tensor") and p.ds_tensor.numel() < p.ds_numel for p in engine.module.parameters())
ema = ParameterEMA(engine.module, beta)
reference = full_state_dict(engine.module)  # the independent EMA, over whole tensors
torch.manual_seed(dist.get_rank())
for _ in range(4):
    batch = torch.randint(10, 200, (2, 12))
    loss = engine(input_ids=batch, labels=batch).loss
    engine.backward(loss)
    engine.step()
    ema.update()
    current = full_state_dict(engine.module)
    reference = {k: beta * reference[k] + (1 - beta) * current[k] for k in reference}
live = full_state_dict(engine.module)
with ema.applied():
    averaged = full_state_dict(engine.module)
after = full_state_dict(engine.module)
out = Path(sys.argv[3])
ema.save(out / "actor_ema", dist.get_rank(), dist.get_world_size())
if dist.get_rank() == 0:
    torch.save(averaged, out / "averaged.pt")
    print(json.dumps({
        "sharded": sharded,
        "max_difference": max(float((averaged[k] - reference[k]).abs().max()) for k in reference),
        "moved_from_live": max(float((averaged[k] - live[k]).abs().max()) for k in live),
        "live_restored": all(torch.equal(after[k], live[k]) for k in live),
    }))
dist.barrier()  # both ranks leave the gloo group together (plugins/optimizers/muon/tests/muon_zero_step.py says why)
dist.destroy_process_group()
