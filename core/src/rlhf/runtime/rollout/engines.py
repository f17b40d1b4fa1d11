"""The controller's side of rollout generation, over the selected engine component.

The engine itself (vLLM, HF ``generate``, a third party's) is a :class:`rlhf.components.RolloutEngine`
registered by a plugin and chosen by ``--rollout.engine`` (:mod:`rlhf.config.rollout_engine`). Where it
lives decides the handle: :class:`RolloutEngines` wraps each engine in an :class:`EngineActor` (its own
Ray actor), spreads requests over them and records their sleep calls; :class:`InRankEngines` spreads
requests over the actor's training ranks, each of which holds an engine on its own trained model.
Both give the agent executors the same ``generate``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlhf.components.first_use import ComponentLabel, FirstUse, library_refusals
from rlhf.config.rollout_engine import engine_label, rollout_engine_class
from rlhf.host.plugin_host import PluginHost
from rlhf.runtime.cluster.host_memory import keep_freed_memory
from rlhf.runtime.cluster.liveness import track, use_cpu_share, wait
from rlhf.runtime.rollout.sleep import SleepSchedule
from rlhf.runtime.workers.group import split_evenly

if TYPE_CHECKING:
    from rlhf.config.ppo import PPOConfig
    from rlhf.runtime.cluster.placement import Placement


class EngineActor:
    """One rollout engine inside its own Ray actor (the actor is dedicated to it).

    Gives the engine its share of the CPU threads before building it (an engine such as in-process
    vLLM fixes its thread count as it starts), records every sleep/wake call in order, and runs the
    engine-side half of the weight-sync transport.
    """

    def __init__(self, engine_class: type, model_path: str, param_dtype: str, max_model_len: int, seed: int,
                 config: dict[str, Any], cpu_sharers: int | None = None, label: ComponentLabel | None = None) -> None:
        """``cpu_sharers``: how many worker processes compute at the same time as this engine (default: the engines);
        ``label``: how a refusal by the library under the engine names it (default: by its class)."""
        use_cpu_share(cpu_sharers or config.get("vllm", {}).get("num_engines") or 1)
        keep_freed_memory()
        label = label or ComponentLabel("rollout engine", engine_class.__name__, "--rollout.engine")
        #: the construction and the first generate and weight load are where the library refuses a model
        self.first_use = FirstUse(label, engine_class)
        with library_refusals(label, engine_class, "while it was built"):
            self.engine = engine_class(model_path, param_dtype, max_model_len, seed, config)
        self.sync_state: dict[str, Any] = {}
        self.sleep_calls: list[list[str]] = []

    def generate(self, requests: list[dict[str, Any]], temperature: float, top_p: float) -> list[dict[str, Any]]:
        with self.first_use.watch("generate"):
            return self.engine.generate(requests, temperature, top_p)

    def load_weights(self, state: dict[str, Any]) -> None:
        with self.first_use.watch("load_weights"):
            self.engine.load_weights(state)

    def sleep(self) -> None:
        self.sleep_calls.append(["sleep"])
        self.engine.sleep()

    def wake_up(self, tags: list[str] | None = None) -> None:
        """``tags``: ``["weights"]`` before a weight sync; None (everything) before generating."""
        self.sleep_calls.append(["wake_up", *(tags or [])])
        self.engine.wake_up(tags)

    def sleep_history(self) -> list[list[str]]:
        """Every sleep/wake call this engine got, in order: ``["sleep"]``, ``["wake_up"]``, ``["wake_up", "weights"]``."""
        return list(self.sleep_calls)

    def sequence_logprobs(self, token_ids: list[int]) -> list[float]:
        return self.engine.sequence_logprobs(token_ids)

    def max_weight_difference(self, state: dict[str, Any]) -> tuple[float, int]:
        return self.engine.max_weight_difference(state)

    def weight_sync_call(self, transport: Any, method: str, *args: Any) -> Any:
        """The transport's engine-side ``method(engine, state, *args)`` (see :class:`rlhf.components.WeightSyncTransport`)."""
        return getattr(transport, method)(self.engine, self.sync_state, *args)


class RolloutEngines:
    """The controller's handle on engines in Ray actors of their own: spreads requests, syncs weights."""

    def __init__(self, config: PPOConfig, model_path: str, placement: Placement, registry: Any = None) -> None:
        """``placement``: the run's :class:`rlhf.runtime.cluster.placement.Placement`; with ``--train.colocate_all``
        (or a ``--train.colocate`` set holding ``engines``) the engines take a share of that group's bundles, otherwise each takes a bundle of its own in the
        engines' placement group. ``registry``: the run's component registry (the plugins loaded by default)."""
        import ray

        if registry is None:

            registry = PluginHost.load().registry
        engine_class = rollout_engine_class(config, registry)
        count = config.vllm.num_engines or 0
        remote = ray.remote(EngineActor)
        # the controller's input check already capped --data.max_len at the model's max_position_embeddings
        max_len = config.data.max_len
        dumped = config.model_dump(mode="json")
        sharers = placement.cpu_sharers(config, engine=True)
        label = engine_label(config, registry)
        self.engines = [
            track(remote.options(**placement.engine_options(i)).remote(
                engine_class, model_path, config.ds.param_dtype, max_len, config.train.seed + i, dumped, sharers, label
            ), "rollout engine", i)
            for i in range(max(1, count))
        ]
        self.sleep = SleepSchedule(self.engines, config.vllm.enable_sleep)  # asleep until the first generation

    def generate(self, requests: list[dict[str, Any]], temperature: float, top_p: float) -> list[dict[str, Any]]:
        return _spread(self.engines, requests, temperature, top_p)

    def load_weights(self, state_ref: Any) -> None:
        wait([e.load_weights.remote(state_ref) for e in self.engines])

    def max_weight_difference(self, state_ref: Any) -> tuple[float, int]:
        """Worst (difference, tensors compared) over the engines; for checks and tests."""
        return _worst(wait([e.max_weight_difference.remote(state_ref) for e in self.engines]))

    def sequence_logprobs(self, token_ids: list[int]) -> list[list[float]]:
        """Each engine's log-probs of ``token_ids[1:]``; for checks and tests."""
        return wait([e.sequence_logprobs.remote(token_ids) for e in self.engines])


class InRankEngines:
    """The controller's handle on engines inside the actor's training ranks (``in_training_rank = True``).

    Each rank built its engine on its own trained model (``PolicyWorker.setup``): there is no engine
    process to place. An engine with ``shares_trained_weights = True`` generates with the weights being
    trained, so a weight sync has nothing to do; any other reloads the rank's own weights after every
    training step (:meth:`refresh`), with no transport. With ``--vllm.enable_sleep`` it sleeps outside
    its phases, in the same order as engines in their own actors.
    """

    def __init__(self, config: PPOConfig, actor: Any, engine_class: type) -> None:
        """``actor``: the actor's :class:`rlhf.runtime.workers.group.WorkerGroup`."""
        self.actor = actor
        self.shares_weights = bool(getattr(engine_class, "shares_trained_weights", False))
        self.engines: list[Any] = []  # no engine actor of its own
        calls = [_RankEngineCalls(w) for w in actor.workers]  # each rank's set-up puts its engine to sleep as it builds it
        self.sleep = SleepSchedule(calls, config.vllm.enable_sleep and not self.shares_weights, asleep_from_the_start=True)

    def refresh(self) -> None:
        """After a training step: every rank's engine holds that rank's current weights."""
        if not self.shares_weights:
            self.actor.call("reload_engine")

    def generate(self, requests: list[dict[str, Any]], temperature: float, top_p: float) -> list[dict[str, Any]]:
        """Every rank is called, an empty share too: an engine on sharded weights generates in step with the others."""
        return _spread(self.actor.workers, requests, temperature, top_p, every_handle=True)

    def max_weight_difference(self, state_ref: Any) -> tuple[float, int]:
        """Worst (difference, tensors compared) over the ranks' engines; for checks and tests."""
        return _worst(self.actor.call("engine_call", "max_weight_difference", state_ref))

    def sequence_logprobs(self, token_ids: list[int]) -> list[list[float]]:
        """Each rank's engine's log-probs of ``token_ids[1:]``; for checks and tests."""
        return self.actor.call("engine_call", "sequence_logprobs", token_ids)


class NoEngines:
    """The controller's handle when the run generates nothing (a rollout scheduler with ``needs_engines = False``:
    replayed rollouts): no engine to place, wake or sync."""

    def __init__(self) -> None:
        self.engines: list[Any] = []  # no engine actor, as InRankEngines
        self.sleep = SleepSchedule([], enabled=False)

    def refresh(self) -> None:
        """After a training step: there is no engine to hand the weights to."""


def _spread(handles: list[Any], requests: list[dict[str, Any]], temperature: float, top_p: float,
            every_handle: bool = False) -> list[dict[str, Any]]:
    """``requests`` in equal contiguous shares over the Ray handles' ``generate``; the results in request order.
    ``every_handle``: call a handle whose share is empty too."""
    chunks = split_evenly(requests, len(handles))
    refs = [h.generate.remote(chunk, temperature, top_p) for h, chunk in zip(handles, chunks) if chunk or every_handle]
    return [r for part in wait(refs) for r in part]


def _worst(results: list[tuple[float, int]]) -> tuple[float, int]:
    """The largest difference and the fewest tensors compared over the engines' ``max_weight_difference``."""
    return max(r[0] for r in results), min(r[1] for r in results)


class _RankEngineCalls:
    """An actor rank seen as an engine actor by :class:`SleepSchedule`: ``sleep.remote()``/``wake_up.remote(tags)``
    reach the rank's engine."""

    def __init__(self, worker: Any) -> None:
        self.sleep = _RemoteEngineMethod(worker, "sleep")
        self.wake_up = _RemoteEngineMethod(worker, "wake_up")


class _RemoteEngineMethod:
    def __init__(self, worker: Any, method: str) -> None:
        self.worker, self.method = worker, method

    def remote(self, *args: Any) -> Any:
        return self.worker.engine_call.remote(self.method, *args)
