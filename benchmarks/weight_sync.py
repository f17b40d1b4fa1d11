"""Seconds per weight sync, object store against the gloo broadcast, for two model sizes.

    python benchmarks/weight_sync.py             # tiny (hidden 128, 2 layers) and ~50 M (hidden 768, 9 layers)
    python benchmarks/weight_sync.py --repeats 3

Two Ray actors on this machine: a sender holding the model in fp32 (as the actor's rank 0 does
outside DeepSpeed) and one HF rollout engine (rlhf-plugin-hf-generate) in the core's engine actor that
loads what arrives, both through the functions the run uses (``full_state``-style state dict into the
object store, or the ``gloo`` transport's ``send_weights`` and its engine half). A sync is
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
        from rlhf.runtime.workers.group import free_port

        return "127.0.0.1", free_port()

    def full_state(self) -> dict:
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    def layout(self) -> list:
        from rlhf.runtime.sync.weights import module_layout

        return module_layout(self.model)

    def join(self, address: str, port: int) -> None:
        from rlhf_plugin_torch_sync.broadcast import BroadcastGroup

        self.group = BroadcastGroup(address, port, 0, 2, "gloo")

    def broadcast(self) -> None:
        import types

        from rlhf_plugin_torch_sync.broadcast import send_weights

        from rlhf.runtime.sync.weights import gathered_buckets, module_layout

        source = types.SimpleNamespace(gathered_buckets=lambda layout: gathered_buckets(self.model, layout))
        send_weights(source, self.group, module_layout(self.model))


def measure(model_path: str, repeats: int) -> dict[str, float]:
    import ray
    from rlhf_plugin_hf_generate.engine import HFEngine
    from rlhf_plugin_torch_sync.broadcast import GlooBroadcast

    from rlhf.config.ppo import PPOConfig
    from rlhf.runtime.rollout.engines import EngineActor

    config = PPOConfig().model_dump(mode="json")
    sender = ray.remote(Sender).options(num_cpus=0).remote(model_path)
    engine = ray.remote(EngineActor).options(num_cpus=0).remote(HFEngine, model_path, "fp32", 128, 0, config)
    transport = GlooBroadcast()
    address, port = ray.get(sender.address.remote())
    layout = ray.get(sender.layout.remote())
    ray.get([sender.join.remote(address, port),
             engine.weight_sync_call.remote(transport, "engine_join", address, port, 1, 2, layout)])

    def object_store() -> None:
        ray.get(engine.load_weights.remote(sender.full_state.remote()))

    def gloo() -> None:
        ray.get([sender.broadcast.remote(), engine.weight_sync_call.remote(transport, "engine_receive")])

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
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)  # never a recorded cluster
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
