"""The service behind the routes: sessions, training runs, sampling sessions and the futures the SDK polls.

Every request that computes (create a run, forward, forward_backward, optim_step, save for the sampler, sample)
becomes a job on one worker thread, in arrival order, and answers at once with a future id; ``retrieve_future``
then returns its result. The SDK submits a training run's requests one after another (its own turn order), so
arrival order is each run's ``seq_id`` order, and one job at a time keeps each tenant's numbers its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import queue
import secrets
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlhf_plugin_tinker_server.checkpoints import CheckpointError, load_into, read_run_state, save_run_state
from rlhf_plugin_tinker_server.losses import LossInputError, check_loss_request, datum_loss
from rlhf_plugin_tinker_server.models import LoraShape, ServedModel
from rlhf_plugin_tinker_server.sampling import SamplingInputError, SamplingRequest, check_sampling_request, sample
from rlhf_plugin_tinker_server.sessions import Sessions
from rlhf_plugin_tinker_server.wire import (
    WireError,
    WireForwardBackward,
    encode_forward_backward_output,
    encode_sample_response,
)

log = logging.getLogger("rlhf.serving")

#: A retrieved result is kept this long, for an SDK that retries a retrieval whose answer it lost
RETRIEVED_KEEP_S = 120.0


class UserInputError(ValueError):
    """A request that names something the server does not have, or that it refuses; the message names the field."""


#: What a job may raise to fail as the user's mistake (the SDK's error category ``user``), not the server's
USER_ERRORS = (UserInputError, LossInputError, SamplingInputError, WireError, CheckpointError)


@dataclass
class Result:
    """A finished future: a protobuf payload, or a JSON body (a result, or ``{"error", "category"}``)."""

    proto: bytes | None = None
    body: dict[str, Any] | None = None


@dataclass
class Future:
    result: Result | None = None  # set once, by the worker, under the service's lock
    retrieved_at: float | None = None
    #: the polls waiting for the result: each event is set on its own event loop when the result arrives
    waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Event]] = field(default_factory=list)


@dataclass
class TrainingRun:
    """One tenant's training run: its adapter on a served model and its own AdamW state."""

    model_id: str
    served: ServedModel
    adapter: str
    shape: LoraShape
    optimizer: Any
    #: the sampling sessions of the run's unnamed snapshots, oldest first (each is an adapter on the shared model)
    snapshots: list[str] = field(default_factory=list)


@dataclass
class SamplerWeights:
    """What a sampling session samples from: a served model and an adapter snapshot (None: the base model)."""

    served: ServedModel
    adapter: str | None
    model_path: str | None = None


def check_fits(served: ServedModel, data: list[Any]) -> None:
    """Refuse a datum longer than the model's context, or with a token id outside its vocabulary."""
    vocabulary = served.module.config.vocab_size
    for index, datum in enumerate(data):
        if len(datum.tokens) > served.max_context_length:
            raise UserInputError(
                f"data[{index}].model_input: {len(datum.tokens)} tokens pass the {served.name} context of "
                f"{served.max_context_length} tokens"
            )
        for name, ids in (
            ("model_input", datum.tokens),
            ("loss_fn_inputs['target_tokens']", datum.loss_fn_inputs["target_tokens"]),
        ):
            outside = [int(token) for token in ids if not 0 <= token < vocabulary]
            if outside:
                raise UserInputError(
                    f"data[{index}].{name}: token id {outside[0]} is outside the {served.name} vocabulary of {vocabulary}"
                )


class TinkerService:
    """``models``: the served base models by the names clients use; ``ppo_loss``: rlhf's PPO-clip policy loss class;
    ``checkpoint_root``: where ``save_state`` writes and ``load_state`` reads (:mod:`.checkpoints`);
    ``keep_snapshots``: how many of a run's latest ``save_weights_and_get_sampling_client`` snapshots stay loaded (an
    RL loop makes one per step; each is an adapter on the shared model, so older ones are dropped);
    ``session_timeout_s``: a session with no heartbeat for this long ends, and its runs are freed."""

    def __init__(
        self,
        models: dict[str, ServedModel],
        ppo_loss: Callable[..., Any],
        checkpoint_root: Path,
        keep_snapshots: int = 8,
        session_timeout_s: float = 300.0,
    ) -> None:
        self.models = models
        self.ppo_loss = ppo_loss
        self.checkpoint_root = checkpoint_root
        self.keep_snapshots = keep_snapshots
        self.sessions = Sessions(
            session_timeout_s, on_end=lambda session_id: self._queue(None, lambda: self.free_runs(session_id))
        )
        self.runs: dict[str, TrainingRun] = {}
        self.freed: dict[str, str] = {}  # a freed training run or sampling session -> why, for the refusal's message
        self.samplers: dict[str, SamplerWeights] = {}
        self.saved_weights: dict[str, SamplerWeights] = {}  # tinker:// paths of save_weights_for_sampler(name)
        self._futures: dict[str, Future] = {}
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._jobs: queue.Queue[tuple[Future | None, Callable[[], Result]] | None] = queue.Queue()
        self._worker = threading.Thread(target=self._work, name="tinker-worker", daemon=True)
        self._worker.start()

    # --- futures -------------------------------------------------------------------------------------------------

    def submit(self, job: Callable[[], Result]) -> str:
        """Queue ``job`` for the worker; the id the SDK polls with ``retrieve_future``."""
        request_id = uuid.uuid4().hex
        with self._lock:
            self._forget_retrieved()
            self._futures[request_id] = future = Future()
        self._queue(future, job)
        return request_id

    def _queue(self, future: Future | None, job: Callable[[], Result]) -> None:
        """``future`` None: the server's own job (freeing an ended session's runs), which nobody polls."""
        self._jobs.put((future, job))

    async def result_within(self, request_id: str, timeout: float) -> Result | None:
        """The future's result once it is there, waiting up to ``timeout`` seconds (None: not yet); KeyError for an
        unknown id. The wait is an event the worker sets, so a held poll costs nothing while it waits."""
        ready = asyncio.Event()
        with self._lock:
            future = self._futures[request_id]
            if future.result is None:
                future.waiters.append((asyncio.get_running_loop(), ready))
        if future.result is None:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(ready.wait(), timeout)
            if future.result is None:
                return None
        future.retrieved_at = future.retrieved_at or time.monotonic()
        return future.result

    def _forget_retrieved(self) -> None:
        now = time.monotonic()
        for request_id in [
            key for key, f in self._futures.items() if f.retrieved_at and now - f.retrieved_at > RETRIEVED_KEEP_S
        ]:
            del self._futures[request_id]

    def _work(self) -> None:
        while (item := self._jobs.get()) is not None:
            future, job = item
            try:
                result = job()
            except USER_ERRORS as exc:
                result = Result(body={"error": str(exc), "category": "user"})
            except Exception as exc:  # noqa: BLE001 - the server's failure goes to the one request that hit it
                log.exception("a tinker request failed")
                result = Result(body={"error": f"{type(exc).__name__}: {exc}", "category": "server"})
            if future is None:
                continue
            with self._lock:
                future.result, waiters, future.waiters = result, future.waiters, []
            for loop, ready in waiters:
                loop.call_soon_threadsafe(ready.set)

    def close(self) -> None:
        self.sessions.close()
        self._jobs.put(None)

    # --- look-ups ------------------------------------------------------------------------------------------------

    def served(self, base_model: str, field_name: str = "base_model") -> ServedModel:
        if base_model in self.models:
            return self.models[base_model]
        raise UserInputError(f"{field_name} {base_model!r}: this server serves {', '.join(sorted(self.models))}")

    def run(self, model_id: str) -> TrainingRun:
        if model_id in self.freed:
            raise UserInputError(f"model_id {model_id!r}: {self.freed[model_id]}")
        if model_id not in self.runs:
            raise UserInputError(f"model_id {model_id!r}: no training run of that id on this server")
        return self.runs[model_id]

    def sampler(self, sampling_session_id: str) -> SamplerWeights:
        if sampling_session_id in self.freed:
            raise UserInputError(f"sampling_session_id {sampling_session_id!r}: {self.freed[sampling_session_id]}")
        if sampling_session_id not in self.samplers:
            raise UserInputError(f"sampling_session_id {sampling_session_id!r}: no sampling session of that id")
        return self.samplers[sampling_session_id]

    # --- jobs (run on the worker) --------------------------------------------------------------------------------

    @staticmethod
    def model_id(session_id: str, model_seq_id: int) -> str:
        """A training run's id: the SDK derives the same one itself when it creates a run from a checkpoint."""
        return f"{session_id}:train:{model_seq_id}"

    def create_run(self, model_id: str, served: ServedModel, shape: LoraShape, seed: int | None) -> TrainingRun:
        import torch

        if model_id in self.runs:
            raise UserInputError(f"model_seq_id: the session already has a training run {model_id}")
        adapter = f"run_{next(self._ids)}"
        served.add_adapter(adapter, shape, seed if seed is not None else secrets.randbits(32))
        # The SDK's AdamParams arrive with each optim_step; these are placeholders the first step overwrites
        optimizer = torch.optim.AdamW(list(served.adapter_parameters(adapter).values()), lr=0.0, weight_decay=0.0)
        self.runs[model_id] = run = TrainingRun(model_id, served, adapter, shape, optimizer)
        return run

    def save_state(self, model_id: str, name: str, overwrite: bool) -> Result:
        run = self.run(model_id)
        path = save_run_state(
            self.checkpoint_root,
            model_id,
            name,
            base_model=run.served.name,
            shape=run.shape,
            adapter=run.adapter,
            parameters=run.served.adapter_parameters(run.adapter),
            optimizer=run.optimizer,
            overwrite=overwrite,
        )
        return Result(body={"path": path, "type": "save_weights"})

    def load_state(self, model_id: str, path: str, with_optimizer: bool, *, new_run_on: str | None = None) -> Result:
        """Load a checkpoint into the run ``model_id``; with ``new_run_on`` (a base model name, "" for the
        checkpoint's own) the run is created from it first, as ``create_training_client_from_state`` asks."""
        state = read_run_state(self.checkpoint_root, path, with_optimizer=with_optimizer)
        if new_run_on is not None:
            run = self.create_run(model_id, self.served(new_run_on or state.base_model), state.shape, seed=0)
        else:
            run = self.run(model_id)
            if run.shape != state.shape or run.served.name != state.base_model:
                raise CheckpointError(
                    f"path {path!r}: a {state.shape} adapter of {state.base_model}, and run {model_id} "
                    f"is a {run.shape} adapter of {run.served.name}"
                )
        load_into(state, run.adapter, run.served.adapter_parameters(run.adapter), run.optimizer)
        return Result(body={"path": path, "model_id": model_id, "type": "load_weights"})

    def forward_backward(self, request: WireForwardBackward) -> Result:
        import torch

        run = self.run(request.model_id)
        check_loss_request(request.loss_fn, request.loss_fn_config, request.data)
        check_fits(run.served, request.data)
        device = run.served.device
        with torch.set_grad_enabled(not request.forward_only):
            logprobs = run.served.target_logprobs(
                run.adapter, [d.tokens for d in request.data], [d.loss_fn_inputs["target_tokens"] for d in request.data]
            )
            total = torch.zeros((), device=device)
            for datum, datum_logprobs in zip(request.data, logprobs):
                inputs = {
                    name: torch.as_tensor(values, device=device)
                    for name, values in datum.loss_fn_inputs.items()
                    if name != "target_tokens"
                }
                total = total + datum_loss(request.loss_fn, datum_logprobs, inputs, request.loss_fn_config, self.ppo_loss)
            if not request.forward_only:
                total.backward()  # gradients add up over calls until the next optim_step, as in Tinker
        outputs = [values.detach().cpu().numpy() for values in logprobs]
        return Result(proto=encode_forward_backward_output(outputs, {"loss:sum": float(total.detach())}))

    def optim_step(self, model_id: str, adam: dict[str, Any]) -> Result:
        import torch

        run = self.run(model_id)
        params = [param for group in run.optimizer.param_groups for param in group["params"]]
        for group in run.optimizer.param_groups:
            group.update(
                lr=adam["learning_rate"],
                betas=(adam["beta1"], adam["beta2"]),
                eps=adam["eps"],
                weight_decay=adam["weight_decay"],
            )
        clip = adam["grad_clip_norm"]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, clip if clip > 0 else float("inf"))
        run.optimizer.step()
        run.optimizer.zero_grad(set_to_none=True)
        return Result(body={"metrics": {"grad_norm:mean": float(grad_norm)}, "type": "optim_step"})

    def save_for_sampler(self, model_id: str, name: str | None) -> Result:
        """A snapshot of the run's adapter that later steps leave alone: a sampling session, or a named path."""
        run = self.run(model_id)
        snapshot = f"{run.adapter}_sampler_{next(self._ids)}"
        run.served.add_adapter(snapshot, run.shape, seed=0)  # overwritten by the copy below
        run.served.copy_adapter(run.adapter, snapshot)
        if name is not None:
            path = f"tinker://{model_id}/sampler_weights/{name}"
            self.saved_weights[path] = SamplerWeights(run.served, snapshot, path)
            return Result(body={"path": path, "type": "save_weights_for_sampler"})
        session_id = self.open_sampler(SamplerWeights(run.served, snapshot))
        run.snapshots.append(session_id)
        while len(run.snapshots) > self.keep_snapshots:
            self._drop_sampler(
                run.snapshots.pop(0),
                f"a snapshot of run {model_id} that newer ones replaced; this server keeps each run's last "
                f"{self.keep_snapshots} (--sampler-snapshots)",
            )
        return Result(body={"sampling_session_id": session_id, "type": "save_weights_for_sampler"})

    def _drop_sampler(self, sampling_session_id: str, why: str) -> None:
        weights = self.samplers.pop(sampling_session_id)
        weights.served.delete_adapter(weights.adapter)
        self.freed[sampling_session_id] = why

    def free_runs(self, session_id: str) -> Result:
        """Free the adapters, optimizer states and sampler snapshots of an ended session's training runs (snapshots
        saved under a name stay: another session may sample from their path)."""
        for model_id in [key for key in self.runs if key.startswith(f"{session_id}:train:")]:
            run = self.runs.pop(model_id)
            for sampling_session_id in run.snapshots:
                self._drop_sampler(sampling_session_id, f"a snapshot of run {model_id}, whose session ended")
            run.served.delete_adapter(run.adapter)
            self.freed[model_id] = f"the training run of session {session_id}, which ended"
        return Result(body={})

    def open_sampler(self, weights: SamplerWeights) -> str:
        sampling_session_id = f"sampler-{next(self._ids)}"
        self.samplers[sampling_session_id] = weights
        return sampling_session_id

    def sample(self, sampling_session_id: str | None, weights: SamplerWeights, request: SamplingRequest) -> Result:
        if sampling_session_id is not None:
            self.sampler(sampling_session_id)  # a snapshot dropped after this request was queued is refused here
        check_sampling_request(request, weights.served)
        sequences, prompt_logprobs = sample(weights.served, weights.adapter, request)
        return Result(proto=encode_sample_response(sequences, prompt_logprobs))
