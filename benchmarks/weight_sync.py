"""Seconds per weight sync, object store against the gloo broadcast, for two model sizes.

    python benchmarks/weight_sync.py             # tiny (hidden 128, 2 layers) and ~50 M (hidden 768, 9 layers)
    python benchmarks/weight_sync.py --repeats 3

Two Ray actors on this machine: a sender holding the model in fp32 (as the actor's rank 0 does
outside DeepSpeed) and one HF rollout engine (``rlhf.runtime.rollout.HFEngine``) that loads what
arrives, both through the functions the run uses (``full_state``-style state dict into the object
store, or ``rlhf.runtime.weight_sync.send_weights``/``WeightReceiver.receive_weights``). A sync is
timed from the controller's call to both ends done, median of the repeats after one warm-up.

A benchmark, not a test: figures depend on the machine and its load.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

SIZES = {"tiny": (128, 2), "50M": (768, 9)}


class Sender:
    def __init__(self, model_path: str) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(model_path)

    def parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())

    def address(self) -> tuple[str, int]:
        from rlhf.runtime.worker_group import free_port

        return "127.0.0.1", free_port()

    def full_state(self) -> dict:
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    def layout(self) -> list:
        from rlhf.runtime.weight_sync import module_layout

        return module_layout(self.model)

    def join(self, address: str, port: int) -> None:
        from rlhf.runtime.weight_sync import BroadcastGroup

        self.group = BroadcastGroup(address, port, 0, 2, "gloo")

    def broadcast(self) -> None:
        from rlhf.runtime.weight_sync import module_layout, send_weights

        send_weights(self.model, self.group, module_layout(self.model))


def measure(model_path: str, repeats: int) -> dict[str, float]:
    import ray
    from rlhf_plugin_hf_generate.engine import HFEngine

    from rlhf.config.ppo import PPOConfig

    config = PPOConfig().model_dump(mode="json")
    sender = ray.remote(Sender).options(num_cpus=0).remote(model_path)
    engine = ray.remote(HFEngine).options(num_cpus=0).remote(model_path, "fp32", 128, 0, config)
    address, port = ray.get(sender.address.remote())
    layout = ray.get(sender.layout.remote())
    ray.get([sender.join.remote(address, port), engine.join_weight_group.remote(address, port, 1, 2, "gloo", layout)])

    def object_store() -> None:
        ray.get(engine.load_weights.remote(sender.full_state.remote()))

    def gloo() -> None:
        ray.get([sender.broadcast.remote(), engine.receive_weights.remote()])

    result = {"parameters": ray.get(sender.parameters.remote())}
    for name, sync in (("object_store", object_store), ("gloo", gloo)):
        sync()  # warm-up
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            sync()
            times.append(time.perf_counter() - start)
        result[name] = statistics.median(times)
    for handle in (sender, engine):
        ray.kill(handle)
    return result


def main() -> None:
    import ray

    from rlhf.testing.tiny import build_causal_lm, build_tokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as root:
            tokenizer = build_tokenizer(Path(root) / "tok")
            print(f"{'model':>6} {'params':>12} {'object_store s':>15} {'gloo s':>8}")
            for label, (hidden, layers) in SIZES.items():
                path = build_causal_lm(Path(root) / label, tokenizer, hidden_size=hidden, layers=layers)
                r = measure(str(path), args.repeats)
                print(f"{label:>6} {r['parameters']:>12,} {r['object_store']:>15.4f} {r['gloo']:>8.4f}", flush=True)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
