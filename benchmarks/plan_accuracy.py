"""How far ``rlhf plan``'s model states are from what DeepSpeed and FSDP2 really hold, measured on CPU.

    python benchmarks/plan_accuracy.py                 # ~60 M-parameter Llama shape (hidden 512, 8 layers)
    python benchmarks/plan_accuracy.py --hidden 896 --layers 24 --vocab 151936   # Qwen2-0.5B's shape (slow)

Each case runs its ranks as processes (gloo on CPU, torch's Adam as every CPU run uses), trains a step and a backward of a
random model, then after a second backward (the optimizer's states exist, the gradients are held: the model states'
peak) counts on rank 0 every torch tensor alive (``gc`` over the tensors, each storage once: weights,
gradients, fp32 partitions, optimizer moments and DeepSpeed's flat and bucket buffers) less what was alive
before the model was built: what a GPU's allocator would hold for the model states (the backward's activations
are freed by then). On a CPU the offloaded states are in the same memory, so an offload case is compared with
the plan's GPU and CPU parts together (the plan without offload). The plan's figure is the backend's ``plan_memory`` for the same shape, ranks and flags, with AdamW's
``plan_state_bytes``. Prints one JSON line per case: planned, measured, and (planned - measured) / measured.

A benchmark, not a test: the counts depend on the library versions (DeepSpeed's bucket sizes).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import tempfile
from types import SimpleNamespace

CASES = [  # (backend, ZeRO stage, ranks, Adam offload)
    ("deepspeed", 0, 1, False), ("deepspeed", 2, 2, False), ("deepspeed", 3, 2, False), ("deepspeed", 3, 2, True),
    ("fsdp2", None, 2, False),
]


def tensor_bytes() -> int:
    import torch

    seen: dict[int, int] = {}
    for obj in gc.get_objects():
        try:
            if isinstance(obj, torch.Tensor) and obj.device.type == "cpu" and not obj.is_meta:
                storage = obj.untyped_storage()
                seen[storage.data_ptr()] = storage.nbytes()
        except (RuntimeError, ReferenceError):
            continue
    return sum(seen.values())


def rank_main(rank: int, world: int, port: int, model_dir: str, case: tuple, out: str) -> None:
    backend, stage, _, offload = case
    os.environ.update(DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    import torch
    import torch.distributed as dist
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    before = tensor_bytes()
    batch = torch.randint(10, 200, (1, 64))
    if backend == "deepspeed":
        import deepspeed
        import deepspeed.ops
        from transformers.integrations import HfDeepSpeedConfig

        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        deepspeed.init_distributed(dist_backend="gloo")
        zero = {"stage": stage, **({"offload_optimizer": {"device": "cpu"}} if offload else {})}
        config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1, "zero_optimization": zero,
                  "bf16": {"enabled": True}, "optimizer": {"type": "AdamW", "params": {"lr": 1e-4, "torch_adam": True}}}
        keep_alive = HfDeepSpeedConfig(config)  # noqa: F841 (ZeRO-3 partitioned init)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
        engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
        engine.backward(engine(input_ids=batch, labels=batch).loss)
        engine.step()
        engine.backward(engine(input_ids=batch, labels=batch).loss)  # measured here: gradients and states held
    else:
        from rlhf_plugin_fsdp2.backend import shard
        from torch.distributed.fsdp import MixedPrecisionPolicy

        dist.init_process_group("gloo")
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        shard(model, MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        model(input_ids=batch, labels=batch).loss.backward()
        optimizer.step()
        model(input_ids=batch, labels=batch).loss.backward()  # measured here: gradients and states held
    gc.collect()
    measured = tensor_bytes() - before
    if rank == 0:
        with open(out, "w") as handle:
            json.dump({"measured": measured}, handle)
    dist.barrier()
    dist.destroy_process_group()


def planned(model_dir: str, case: tuple) -> int:
    from rlhf_plugin_adamw.optim import AdamW

    from rlhf.planning import PlannedModel, model_shape

    backend, stage, ranks, _ = case
    shape = model_shape(model_dir, "--model")
    model = PlannedModel("actor", shape, True, ranks, shape.parameters, AdamW.plan_state_bytes(shape, shape.parameters))
    # offloaded states live in the same (CPU) memory here: planned wherever they are, as without offload
    config = SimpleNamespace(ds=SimpleNamespace(zero_stage=stage, param_dtype="bf16", adam_offload=False,
                                                tensor_parallel_size=1, enable_sleep=False, overlap_comm=False))
    if backend == "deepspeed":
        from rlhf_plugin_deepspeed.backend import DeepSpeedBackend as Backend
    else:
        from rlhf_plugin_fsdp2.backend import FSDP2Backend as Backend
    # working memory that is gone after a backward is left out: the gather buffer (a forward's), and ZeRO-1/2's
    # reduce bucket (allocated as each backward starts, dropped as it ends; ZeRO-3 keeps its bucket)
    transient = {"gather buffer"} | ({"reduce bucket"} if stage in (1, 2) else set())
    return sum(p.nbytes for p in Backend.plan_memory(config, model) if p.part not in transient)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    args = parser.parse_args()
    import torch.multiprocessing as mp
    from transformers import LlamaConfig, LlamaForCausalLM

    with tempfile.TemporaryDirectory() as tmp:
        config = LlamaConfig(hidden_size=args.hidden, intermediate_size=args.hidden * 8 // 3 // 64 * 64,
                             num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                             num_key_value_heads=max(1, args.hidden // 256), vocab_size=args.vocab,
                             tie_word_embeddings=False)
        LlamaForCausalLM(config).save_pretrained(tmp)
        for number, case in enumerate(CASES):
            out = os.path.join(tmp, f"case{number}.json")
            mp.spawn(rank_main, args=(case[2], 29600 + number, tmp, case, out), nprocs=case[2])
            with open(out) as handle:
                measured = json.load(handle)["measured"]
            plan = planned(tmp, case)
            print(json.dumps({"backend": case[0], "zero_stage": case[1], "ranks": case[2], "adam_offload": case[3],
                              "planned": plan, "measured": measured,
                              "error": round((plan - measured) / measured, 3)}), flush=True)


if __name__ == "__main__":
    main()
