"""Train the tiny causal LM under DeepSpeed on gloo (one CPU rank) twice from the same seed, with the states
awake throughout and then asleep between steps (one process: DeepSpeed's import and start-up once).

Usage: python deepspeed_sleep.py MODEL_DIR ZERO_STAGE ; prints JSON on the last line: {"plain": run, "slept": run},
each run with its losses, the states DeepSpeed reports offloaded while asleep and after a wake, and the loss of
a forward while asleep.
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
from rlhf_plugin_deepspeed.sleep import SleepingStates  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from transformers.integrations import HfDeepSpeedConfig  # noqa: E402

deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # no 45 s JIT build; plain gloo
deepspeed.init_distributed(dist_backend="gloo")
stage = int(sys.argv[2])


def train(sleeping: bool) -> dict:
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": stage},
        "bf16": {"enabled": False},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True, "foreach": True}},
    }
    keep_alive = HfDeepSpeedConfig(config)  # must outlive from_pretrained for ZeRO-3 partitioned init
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    states = SleepingStates(engine, sleeping)
    states.sleep()  # after set-up, as the workers do
    batches = [torch.randint(10, 200, (4, 16), generator=torch.Generator().manual_seed(i)) for i in range(4)]
    losses, asleep, awake = [], [], []
    for batch in batches:
        with states.awake("train"):
            awake.append(sorted(s.value for s in engine.optimizer.offloaded_states))
            loss = engine(input_ids=batch, labels=batch).loss
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        asleep.append(sorted(s.value for s in engine.optimizer.offloaded_states))
    with torch.no_grad():  # a forward while asleep: the compute weights stayed
        asleep_loss = engine(input_ids=batches[0], labels=batches[0]).loss.item()
    del keep_alive
    return {"losses": losses, "asleep": asleep, "awake": awake, "asleep_loss": asleep_loss,
            "wanted": sorted(s.value for s in states.states)}


print(json.dumps({"plain": train(False), "slept": train(True)}))
