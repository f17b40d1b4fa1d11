"""Train the tiny causal LM for a few steps under DeepSpeed ZeRO-3 on gloo (one CPU rank).

Usage: python deepspeed_zero3_step.py MODEL_DIR ; prints the losses as JSON on the last line.
"""

import json
import os
import sys

os.environ.setdefault("DS_ACCELERATOR", "cpu")
for key, value in {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29517", "RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
    os.environ.setdefault(key, value)

import deepspeed  # noqa: E402
import deepspeed.ops  # noqa: E402
import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.integrations import HfDeepSpeedConfig  # noqa: E402

deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # no 45 s JIT build; plain gloo
deepspeed.init_distributed(dist_backend="gloo")
config = {
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 1,
    "zero_optimization": {"stage": 3},
    "bf16": {"enabled": False},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
}
keep_alive = HfDeepSpeedConfig(config)  # must outlive from_pretrained for ZeRO-3 partitioned init
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
torch.manual_seed(0)
batch = torch.randint(10, 200, (4, 16))
losses = []
for _ in range(5):
    loss = engine(input_ids=batch, labels=batch).loss
    engine.backward(loss)
    engine.step()
    losses.append(loss.item())
print(json.dumps({"losses": losses, "zero_stage": engine.zero_optimization_stage()}))
