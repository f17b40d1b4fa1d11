"""The routing-replay model extension (contract: :mod:`rlhf.models.extensions`), switched on by ``--actor.routing_replay``.

* ``record``: the rollout engine keeps the experts each position was routed to in every MoE layer, as
  ``GenerationResult.token_records["routed_experts"]`` ``(positions, layers, k)``; the sample carries it to the
  actor and reference workers with the policy version that sampled it.
* ``before_forward``: the actor and the reference forwards route by those ids (``rollout``) or compare their own
  top-k with them (``record``); training forwards count the MoE metrics (:meth:`RouterTaps.metrics`).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

from rlhf.errors import ConfigError
from rlhf_plugin_moe_replay.routers import find_routers, taps_of

log = logging.getLogger("rlhf.moe")

FLAG = "--actor.routing_replay"
RECORD = "routed_experts"
#: the roles whose forwards replay the engine's routes (the critic and the reward model are other models)
ROLES = ("actor", "ref")


class RoutingReplay:
    def __init__(self, mode: str = "rollout") -> None:
        self.mode = mode
        self.taps: dict[str, Any] = {}  #: role -> the taps on that role's model (this worker's)
        self.told_unrecorded = False  #: warned once that a training forward had no record to route by

    @classmethod
    def from_config(cls, config: Any) -> RoutingReplay:
        return cls(config.actor.routing_replay)

    @property
    def needs_engine_records(self) -> str | None:
        """What asks for the rollout engine's records (the core refuses an engine without the trait
        ``records_token_values``): routing by the engine's routes cannot do without them; ``record`` only compares."""
        return f"{FLAG} rollout" if self.mode == "rollout" else None

    def wrap(self, model: Any, role: str, config: Any) -> Any:
        """In a model worker, after loading: install the router taps on the actor and reference models."""
        if role not in ROLES:
            return model
        if self.mode == "rollout" and config.rollout.replay_dir:
            raise ConfigError(f"{FLAG} rollout: the rollouts --rollout.replay_dir trains on were dumped without the "
                              "engine's routing records (a dump keeps tokens and log-probs), so there is nothing to route "
                              f"by; drop one of the two ({FLAG} record still logs the expert load)")
        routers = find_routers(model)
        if not routers:
            raise ConfigError(f"{FLAG} {self.mode}: the {role} model {type(model).__name__} has no top-k MoE router "
                              "(transformers' fused-experts families: Qwen3-MoE, OLMoE, Mixtral, Qwen2-MoE); "
                              f"drop {FLAG} for a dense model")
        self.taps[role] = taps_of(model)
        return model

    @contextlib.contextmanager
    def record(self, module: Any, rows: int) -> Iterator[Callable[[], dict[str, Any]]]:
        """Around one ``generate`` call of ``rows`` sequences: the routers' choices of every position it forwarded."""
        taps = taps_of(module)
        if taps is None:
            yield dict
            return
        taps.start_recording(rows)
        recorded: dict[str, Any] = {}
        try:
            yield lambda: recorded
        finally:
            recorded[RECORD] = taps.stop_recording()

    def before_forward(self, module: Any, tokens: Any) -> None:
        """Route the coming forward by the samples' records (``rollout``), or only compare with them (``record``)."""
        import torch

        taps = taps_of(module)
        if taps is None or taps not in self.taps.values():  # a critic or reward model: not the policy's routes
            return
        rows, length = tokens.shape
        valid = torch.zeros((rows, length), dtype=torch.bool)
        forced = None
        for i, (row, start, count) in enumerate(zip(tokens.rows, tokens.starts, tokens.lengths)):
            valid[row, start : start + count] = True
            record = (tokens.records[i] or {}).get(RECORD)
            if record is None:
                continue
            if tuple(record.shape[1:]) != (taps.layers, taps.top_k):
                raise ConfigError(f"{FLAG}: the rollout engine recorded {record.shape[1]} MoE layers x top-{record.shape[2]} "
                                  f"per token, the trainer's model routes {taps.layers} x top-{taps.top_k}: the engine "
                                  "must serve the same model")
            if forced is None:
                forced = torch.full((rows, length, taps.layers, taps.top_k), -1, dtype=torch.int16)
            take = min(len(record), count)
            forced[row, start : start + take] = torch.tensor(record[:take], dtype=torch.int16)  # a copy: Ray's arrays are read-only
        if forced is None and tokens.training and self.mode == "rollout" and not self.told_unrecorded:
            self.told_unrecorded = True
            log.warning("%s rollout: a training micro-batch carries no routing record, so the trainer routes it by its own "
                        "top-k (the rollout engine records none, as vLLM's does not yet, or a multi-turn executor's samples; "
                        "docs/moe.md); said once per run", FLAG)
        device = next(module.parameters()).device  # the forward's: one copy per micro-batch, not one per layer
        taps.route(None if forced is None else forced.view(rows * length, taps.layers, taps.top_k).to(device),
                   valid.view(-1).to(device), replay=self.mode == "rollout", measure=tokens.training)

    def plan_memory(self, config: Any, model: Any) -> list[Any]:
        """``rlhf plan``: the int16 expert ids of one forward micro-batch on an actor or reference GPU (the larger of a
        training and an experience micro-batch, every sequence at ``--data.max_len``) over every MoE layer."""
        from rlhf.planning import MemoryPart

        if model.role not in ROLES:
            return []
        layers, top_k = moe_layout(model.shape.path)
        sequences = max(config.train.micro_batch_size, config.rollout.micro_batch_size) if model.trained else config.rollout.micro_batch_size
        tokens = sequences * config.data.max_len
        return [MemoryPart("routing record", tokens * layers * top_k * 2,
                           f"{tokens} tokens x {layers} MoE layers x top-{top_k} x 2 B ({FLAG} {self.mode})")]

    def metrics(self) -> dict[str, float]:
        """The MoE metrics of this rank's training forwards since the last call."""
        taps = self.taps.get("actor")
        return taps.metrics() if taps is not None else {}


def moe_layout(path: str) -> tuple[int, int]:
    """(MoE layers, experts per token) of the model at ``path``, from its config (``num_experts_per_tok``; the layers
    that are not MoE by ``mlp_only_layers`` / ``decoder_sparse_step``, as Qwen's configs say)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    config = getattr(config, "text_config", None) or config
    layers = config.num_hidden_layers
    dense = set(getattr(config, "mlp_only_layers", None) or [])
    step = getattr(config, "decoder_sparse_step", 1) or 1
    moe = [i for i in range(layers) if i not in dense and (i + 1) % step == 0]
    return len(moe), int(getattr(config, "num_experts_per_tok", 0) or 0)
