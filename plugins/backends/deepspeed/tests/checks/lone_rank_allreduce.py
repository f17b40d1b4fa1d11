"""Train the tiny causal LM on one gloo rank twice from the same weights: DeepSpeed's gradient
all-reduce on, then off as ``skip_lone_rank_allreduce`` turns it off.

Usage: python lone_rank_allreduce.py MODEL_DIR ZERO_STAGE... ; prints one JSON line per stage, in order: whether
the skip turned the all-reduce off, and whether every final weight is bit-identical to the run with it. The stages
share this process (its interpreter, imports and process group).
"""

import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "0", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
    os.environ.setdefault(key, value)

import deepspeed  # noqa: E402
import deepspeed.ops  # noqa: E402
import torch  # noqa: E402
from rlhf_plugin_deepspeed.backend import skip_lone_rank_allreduce  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # no 45 s JIT build; plain gloo
deepspeed.init_distributed(dist_backend="gloo")
batches = [torch.randint(10, 200, (2, 16), generator=torch.Generator().manual_seed(i)) for i in range(6)]


def train(stage: int, skip: bool) -> tuple[dict[str, torch.Tensor], bool]:
    config = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,  # the all-reduce runs at the boundary micro-batch only
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": stage},
        "bf16": {"enabled": False},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "torch_adam": True, "foreach": True}},
    }
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    if skip:
        skip_lone_rank_allreduce(engine)
    for batch in batches:
        engine.backward(engine(input_ids=batch, labels=batch).loss)
        engine.step()
    return {k: v.detach().clone() for k, v in engine.module.state_dict().items()}, engine.enable_backward_allreduce


initial = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32).state_dict()
for stage in map(int, sys.argv[2:]):
    reduced, _ = train(stage, skip=False)
    skipped, allreduce_on = train(stage, skip=True)
    print(json.dumps({"stage": stage, "allreduce_on": allreduce_on,
                      "identical": all(torch.equal(reduced[k], skipped[k]) for k in reduced),
                      "moved": max(float((reduced[k] - initial[k]).abs().max()) for k in reduced)}))
