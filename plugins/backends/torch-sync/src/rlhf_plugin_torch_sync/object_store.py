"""``--vllm.sync_backend object_store``: rank 0's full state dict, put in Ray's object store once."""

from __future__ import annotations

from typing import Any


class ObjectStoreTransport:
    """Every rank gathers (ZeRO-3 collectively); rank 0's result is read by every engine from the
    object store. Runs everywhere, LoRA (merged adapters) and AutoTP included: ``auto``'s last resort."""

    auto_preference = 10
    serves_in_process_actor = True  # rank 0's state reaches the engines as a reference, whichever process made it

    @classmethod
    def unavailable_reason(cls, config: Any, cuda: bool) -> str | None:
        return None

    def connect(self, actor: Any, engines: list[Any]) -> None:
        """Nothing to set up."""

    def sync(self, actor: Any, engines: list[Any]) -> None:
        import ray

        refs = actor.call_async("weight_sync_call", self, "full_state")
        # the engines read rank 0's result as soon as it exists, while the other ranks finish
        ray.get([e.load_weights.remote(refs[0]) for e in engines])
        ray.get(refs)

    def full_state(self, source: Any) -> dict[str, Any] | None:
        return source.full_state()
