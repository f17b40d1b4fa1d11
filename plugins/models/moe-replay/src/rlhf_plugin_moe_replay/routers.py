"""Taps on a model's MoE routers: record the experts each token goes to, route by recorded ones, measure.

transformers' fused-experts MoE families (Qwen3-MoE, OLMoE, Mixtral, Qwen2-MoE…) route with a ``*TopKRouter``
module: ``forward(hidden (N, H)) -> (router_logits (N, E), weights (N, k), expert ids (N, k))``, called once per MoE
layer on the forward's ``(R, L)`` tokens flattened row by row. A forward hook on each router reads its output and
may replace it, so the same taps serve the engine (recording) and the trainer (replaying), under DeepSpeed or FSDP2
as well (the hook reads the logits only, never the router's parameters).

Replay follows arXiv 2510.23027 (rollout routing replay): the recorded ids choose the experts; their weights are the
trainer's own softmax of the router logits gathered at those ids (renormalised where the router renormalises its
top-k), so the router is still trained by the policy gradient.
"""

from __future__ import annotations

import math
import weakref
from typing import Any

#: the taps of each model, keyed by its first router (the same for a PEFT wrapper, DeepSpeed's module or the bare model)
_TAPS: weakref.WeakKeyDictionary[Any, RouterTaps] = weakref.WeakKeyDictionary()


def find_routers(module: Any) -> list[Any]:
    """The top-k router modules of ``module``, in layer order (empty for a dense model)."""
    return [m for _, m in module.named_modules()
            if type(m).__name__.endswith("TopKRouter") and hasattr(m, "top_k") and hasattr(m, "num_experts")]


def taps_of(module: Any) -> RouterTaps | None:
    """The taps on ``module``'s routers, installed on first use; None for a model with no top-k router."""
    routers = find_routers(module)
    if not routers:
        return None
    if routers[0] not in _TAPS:
        _TAPS[routers[0]] = RouterTaps(routers)
    return _TAPS[routers[0]]


class RouterTaps:
    """One forward hook per router of a model, and what they record, replay and count.

    States: recording (an engine's ``generate``: each router's ids appended per call), routed (a trainer's forward
    with ``forced`` ids set by :meth:`route`; ``replay`` False only compares), or idle (own routing, nothing kept).
    """

    def __init__(self, routers: list[Any]) -> None:
        self.layers = len(routers)
        self.top_k = int(routers[0].top_k)
        self.experts = int(routers[0].num_experts)
        self.layer_of = {id(r): i for i, r in enumerate(routers)}
        self.recorded: list[list[Any]] | None = None  #: per layer, ``(rows, positions, k)`` per forward while recording
        self.rows = 0
        self.forced: Any = None  #: ``(N, layers, k)`` int16 expert ids to route by, -1 where none was recorded
        self.valid: Any = None  #: ``(N,)`` bool: positions that hold a sample's token (not padding)
        self.replay = False  #: route by ``forced`` (True) or only compare with it (False)
        self.measure = False  #: count this forward into the step's metrics (training forwards)
        self._measured: set[int] = set()  #: layers counted since :meth:`route` (a checkpointed layer runs twice)
        self.reset_counts()
        self.handles = [r.register_forward_hook(self._hook) for r in routers]

    # ------------------------------------------------------------------ engine side

    def start_recording(self, rows: int) -> None:
        self.forced, self.recorded, self.rows = None, [[] for _ in range(self.layers)], rows

    def stop_recording(self) -> Any:
        """``(rows, positions, layers, k)`` expert ids (uint8, int16 past 256 experts) of every position forwarded."""
        import torch

        recorded, self.recorded = self.recorded, None
        if not recorded or not recorded[0]:
            return torch.zeros((self.rows, 0, self.layers, self.top_k), dtype=self.dtype)
        return torch.stack([torch.cat(calls, dim=1) for calls in recorded], dim=2)

    @property
    def dtype(self) -> Any:
        import torch

        return torch.uint8 if self.experts <= 256 else torch.int16

    # ----------------------------------------------------------------- trainer side

    def route(self, forced: Any, valid: Any, replay: bool, measure: bool) -> None:
        """The next forwards (until the next call: a checkpointed layer's recompute in the backward too) route by
        ``forced`` ``(N, layers, k)`` (None: by their own top-k) over ``N`` tokens, ``valid`` ``(N,)`` of them real."""
        self.forced, self.valid, self.replay, self.measure = forced, valid, replay, measure
        self._measured = set()

    def reset_counts(self) -> None:
        import torch

        self.load = torch.zeros((self.layers, self.experts), dtype=torch.float64)  #: tokens routed to each expert
        self.mean_prob = torch.zeros((self.layers, self.experts), dtype=torch.float64)  #: summed router probabilities
        self.tokens = torch.zeros(self.layers, dtype=torch.float64)
        self.compared = 0.0  #: (token, layer) pairs with an engine record
        self.disagreed = 0.0  #: ... whose trainer top-k set differs from the engine's
        self.mismatched = 0.0  #: ... whose experts used differ from the engine's (0 when replayed)

    def _hook(self, router: Any, args: Any, output: Any) -> Any:
        import torch

        logits, weights, ids = output
        layer = self.layer_of[id(router)]
        if self.recorded is not None:
            self.recorded[layer].append(ids.detach().view(self.rows, -1, ids.shape[-1]).to(self.dtype))
            return None
        if self.valid is None:
            return None
        if self.valid.shape[0] != ids.shape[0]:
            raise RuntimeError(f"routing replay: the router of MoE layer {layer} saw {ids.shape[0]} tokens, the forward "
                               f"was announced with {self.valid.shape[0]} (a layout that splits rows, e.g. ring attention, is not supported)")
        recorded = None if self.forced is None else self.forced[:, layer].long()
        have = None if recorded is None else (recorded[:, 0] >= 0) & self.valid
        used, used_weights = ids, weights
        if self.replay and have is not None:
            chosen = torch.where(have[:, None], recorded, ids)
            probs = torch.softmax(logits.float(), dim=-1)
            gathered = probs.gather(-1, chosen)
            if getattr(router, "norm_topk_prob", True):  # Mixtral always renormalises; Qwen3-MoE and OLMoE by config
                gathered = gathered / gathered.sum(dim=-1, keepdim=True)
            used_weights = torch.where(have[:, None], gathered.to(weights.dtype), weights)
            used = chosen
        if self.measure and layer not in self._measured:
            self._measured.add(layer)
            self._count(layer, logits.detach(), ids.detach(), used.detach(), recorded, have)
        return None if used is ids else (logits, used_weights, used)

    def _count(self, layer: int, logits: Any, own: Any, used: Any, recorded: Any, have: Any) -> None:
        import torch

        valid = self.valid
        self.tokens[layer] += float(valid.sum())
        self.load[layer] += torch.bincount(used[valid].reshape(-1).long(), minlength=self.experts).double().cpu()
        self.mean_prob[layer] += torch.softmax(logits[valid].float(), dim=-1).sum(dim=0).double().cpu()
        if have is not None and bool(have.any()):
            engine = recorded[have].long().sort(dim=-1).values
            self.compared += float(have.sum())
            self.disagreed += float((own[have].sort(dim=-1).values != engine).any(dim=-1).sum())
            self.mismatched += float((used[have].sort(dim=-1).values != engine).any(dim=-1).sum())

    def metrics(self) -> dict[str, float]:
        """What the training forwards counted since the last call (then reset); empty when none was counted.

        ``moe/routing_mismatch``: share of (token, layer) whose experts used differ (as a set) from the engine's
        (0 with replay); ``moe/router_disagreement``: the same for the trainer's own top-k (what replay overrides);
        ``moe/load_max_over_mean`` and ``moe/load_entropy``: per layer, the busiest expert's tokens over the mean
        and the entropy of the load over log(E) (1: balanced), averaged over layers; ``moe/aux_loss``: the
        switch-transformer balancing loss E·Σₑ fₑ·Pₑ (as transformers computes it) averaged over layers."""
        counted = self.tokens > 0
        if not bool(counted.any()):
            return {}
        load, tokens = self.load[counted], self.tokens[counted]
        share = load / load.sum(dim=1, keepdim=True)
        entropy = -(share * share.clamp(min=1e-30).log()).sum(dim=1) / math.log(self.experts)
        aux = self.experts * ((load / tokens[:, None]) * (self.mean_prob[counted] / tokens[:, None])).sum(dim=1)
        out = {"moe/load_max_over_mean": float((load.max(dim=1).values / load.mean(dim=1)).mean()),
               "moe/load_entropy": float(entropy.mean()), "moe/aux_loss": float(aux.mean())}
        if self.compared:
            out["moe/routing_mismatch"] = self.mismatched / self.compared
            out["moe/router_disagreement"] = self.disagreed / self.compared
        self.reset_counts()
        return out
