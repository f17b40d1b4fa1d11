"""Conformance kits of sample filters, agent executors, optimizers, schedulers, model loaders and
processors (docs/plugins/<kind>.md)."""

from __future__ import annotations

import hashlib
import math
from typing import Any

from rlhf.registry import ComponentKind
from rlhf.testing.conformance import tensors as tt
from rlhf.testing.conformance._core import (
    ComponentKit,
    ContractProperties,
    check_picklable,
    fail,
    first_failure,
    not_collected,
    ppo_config,
    show,
)
from rlhf.testing.conformance.planning import check_optimizer_plan

FILTER = ComponentKind.SAMPLE_FILTER.label
AGENT = ComponentKind.AGENT_EXECUTOR.label
OPTIMIZER = ComponentKind.OPTIMIZER.label
SCHEDULER = ComponentKind.SCHEDULER.label
LOADER = ComponentKind.MODEL_LOADER.label
PROCESSOR = ComponentKind.PROCESSOR.label


def check_sample_filter(sample_filter: Any) -> None:
    """``(P, n)`` scores -> bool ``(P,)``; all-equal groups, bf16 scores; deterministic; picklable."""
    import torch

    def case(scores: Any) -> Any:
        def check() -> str | None:
            keep = sample_filter.keep(scores)
            if keep.dtype != torch.bool or tuple(keep.shape) != (scores.shape[0],):
                return f"returned {keep.dtype} of shape {tuple(keep.shape)}, expected bool of shape {(scores.shape[0],)}"
            if not torch.equal(sample_filter.keep(scores.clone()), keep):
                return "two calls on the same scores differ (not deterministic)"
            return None

        return f"scores={show(scores)}", check

    cases = []
    for p, n, _ in tt.SIZES:
        cases += [case(torch.zeros(p, n)), case(torch.ones(p, n)), case(torch.rand(p, n, generator=tt.generator(p)).round()),
                  case(tt.randn(p, n, seed=p).to(torch.bfloat16))]
    first_failure(FILTER, "keep shape/dtype", cases)
    check_picklable(FILTER, sample_filter)


class SampleFilterKit(ContractProperties, ComponentKit):
    kind = ComponentKind.SAMPLE_FILTER
    contract_properties = ("keep shape/dtype", "picklable for Ray",)

    @not_collected
    def test_contract(self) -> None:
        check_sample_filter(self.make_component())


# ------------------------------------------------------------------ agent executors


class ScriptedEngines:
    """A deterministic stand-in for :class:`rlhf.runtime.rollout.engines.RolloutEngines` with the same
    ``generate(requests, temperature, top_p)`` contract: each response is derived from the
    request's prompt ids and seed, so an executor's output can be checked without a model."""

    def __init__(self, vocab_size: int = 64, eos_id: int = 2) -> None:
        self.vocab_size, self.eos_id = vocab_size, eos_id
        self.calls: list[int] = []

    def generate(self, requests: list[dict[str, Any]], temperature: float, top_p: float) -> list[dict[str, Any]]:
        self.calls.append(len(requests))
        out = []
        for request in requests:
            digest = hashlib.sha256(repr((request["prompt_ids"], request.get("seed"))).encode()).digest()
            length = 1 + digest[0] % max(1, request["max_tokens"])
            ids = [3 + b % (self.vocab_size - 3) for b in digest[1:length + 1]][:request["max_tokens"]]
            stop = digest[0] % 2 == 0 and len(ids) < request["max_tokens"]
            if stop:
                ids.append(self.eos_id)
            out.append({"response_ids": ids, "logprobs": [-1.0 - (i % 3) * 0.5 for i in ids],
                        "finish_reason": "stop" if stop else "length"})
        return out


def agent_requests(count: int, max_tokens: int = 6) -> list[dict[str, Any]]:
    return [{"prompt_ids": [5 + i, 7, 9 + i % 3], "prompt": f"prompt {i}", "label": str(i), "max_tokens": max_tokens, "seed": i}
            for i in range(count)]


def _number_problem(where: str, value: Any) -> str | None:
    """Why ``value`` is not a finite real number (what the reward stage's ``float()`` and the means need)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{where} must be a number, got {type(value).__name__} {show(value)}"
    if math.isnan(value):
        return f"{where} is NaN"
    if math.isinf(value):
        return f"{where} is infinite"
    return None


def _agent_result_problem(where: str, agent: Any) -> str | None:
    """``{"reward", "score"?, "extra_logs"?}`` with numbers, or ``{"error": "what failed"}``."""
    if not isinstance(agent, dict):
        return f"{where} must be a dict, got {type(agent).__name__} {show(agent)}"
    if "error" in agent:
        return None if isinstance(agent["error"], str) and agent["error"] else f"{where}['error'] must be a non-empty string"
    if "reward" not in agent:
        return f"{where} has neither 'reward' nor 'error' (keys {sorted(agent)})"
    problems = [_number_problem(f"{where}['reward']", agent["reward"])]
    if "score" in agent:
        problems.append(_number_problem(f"{where}['score']", agent["score"]))
    logs = agent.get("extra_logs") or {}
    if not isinstance(logs, dict):
        problems.append(f"{where}['extra_logs'] must be a dict of name -> number, got {type(logs).__name__}")
    else:
        problems += [_number_problem(f"{where}['extra_logs'][{key!r}]", value) for key, value in logs.items()]
    return next((p for p in problems if p), None)


def _trajectory_problem(i: int, trajectory: dict[str, Any], provides_rewards: bool) -> str | None:
    ids, logprobs = trajectory.get("response_ids"), trajectory.get("logprobs")
    if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids):
        return f"trajectory {i}: response_ids must be a list of ints, got {show(ids)}"
    if not isinstance(logprobs, list) or len(logprobs) != len(ids):
        return f"trajectory {i}: {len(logprobs or [])} log-probs for {len(ids)} response tokens"
    if problem := next((p for j, lp in enumerate(logprobs) if (p := _number_problem(f"logprobs[{j}]", lp))), None):
        return f"trajectory {i}: {problem}"
    if trajectory.get("finish_reason") not in ("stop", "length"):
        return f"trajectory {i}: finish_reason {trajectory.get('finish_reason')!r} is not 'stop' or 'length'"
    mask = trajectory.get("action_mask")
    if mask is not None and (not isinstance(mask, list) or len(mask) != len(ids)):
        return f"trajectory {i}: action_mask must be a list with one 0/1 per response token ({len(ids)}), got {show(mask)}"
    if mask is not None and any(isinstance(m, bool) or m not in (0, 1) for m in mask):
        return f"trajectory {i}: action_mask must hold only 0 and 1, got {show(mask)}"
    if provides_rewards and "agent" not in trajectory:
        return f"trajectory {i}: the executor declares provides_rewards but returned no 'agent' result"
    if "agent" in trajectory:
        return _agent_result_problem(f"trajectory {i}: agent", trajectory["agent"])
    return None


def check_agent_executor(executor: Any) -> None:
    """One trajectory per request in request order: int ``response_ids`` within ``max_tokens`` (plus a
    final eos), one finite log-prob per token, ``finish_reason`` stop/length, an ``action_mask`` (when
    given) of one 0/1 per token, an ``agent`` result (required with ``provides_rewards``) with a finite
    number ``reward`` or an ``error``; no requests -> []; deterministic; not every episode an ``error``."""
    sampling = {"temperature": 1.0, "top_p": 1.0}
    provides_rewards = bool(getattr(executor, "provides_rewards", False))

    def case(count: int) -> Any:
        requests = agent_requests(count)

        def check() -> str | None:
            out = executor.run(requests, ScriptedEngines(), sampling)
            if not isinstance(out, list) or len(out) != count:
                return f"returned {len(out) if isinstance(out, list) else type(out).__name__} trajectories for {count} requests"
            for i, trajectory in enumerate(out):
                if not isinstance(trajectory, dict):
                    return f"trajectory {i} must be a dict, got {type(trajectory).__name__}"
                if problem := _trajectory_problem(i, trajectory, provides_rewards):
                    return problem
            if executor.run(requests, ScriptedEngines(), sampling) != out:
                return "two runs on the same requests differ (not deterministic)"
            return None

        return f"{count} request(s) {show(requests)}", check

    first_failure(AGENT, "one trajectory per request", [case(count) for count in (0, 1, 3)])

    def some_run() -> str | None:
        """A failed episode is a valid answer (the reward stage applies --reward.on_error to it), but an environment
        whose every episode fails (a reset that always raises, an import that never works) is broken."""
        out = executor.run(agent_requests(4), ScriptedEngines(), sampling)
        errors = [t["agent"]["error"] for t in out if isinstance(t.get("agent"), dict) and t["agent"].get("error")]
        return f"all {len(out)} episodes failed, the first with: {errors[0]}" if out and len(errors) == len(out) else None

    first_failure(AGENT, "episodes that run", [("4 requests on the scripted engine", some_run)])
    check_picklable(AGENT, executor)


class AgentExecutorKit(ContractProperties, ComponentKit):
    kind = ComponentKind.AGENT_EXECUTOR
    contract_properties = ("one trajectory per request", "episodes that run", "picklable for Ray")

    @not_collected
    def test_contract(self) -> None:
        check_agent_executor(self.make_component())


# ------------------------------------------------------------------ optimizers and schedulers


def _tiny_problem() -> tuple[Any, Any]:
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    inputs, target = torch.randn(8, 4), torch.randn(8, 1)
    return model, lambda: torch.nn.functional.mse_loss(model(inputs), target)


def check_optimizer(factory: Any, section: Any = None) -> None:
    """``deepspeed_config`` gives a DeepSpeed ``optimizer`` block or None; ``build`` gives a torch
    optimizer whose steps lower a tiny regression loss and keep the weights finite; picklable."""
    import torch

    section = section if section is not None else _trained_section()
    block = factory.deepspeed_config(section)
    if block is not None and not (isinstance(block, dict) and isinstance(block.get("type"), str)):
        raise fail(OPTIMIZER, "deepspeed_config", f"returned {show(block)}, expected None or a dict with a 'type'")
    if hasattr(section, "adam"):  # a learning rate large enough to move in a few steps
        section = section.model_copy(update={"adam": section.adam.model_copy(update={"lr": 1e-2})})
    model, loss_fn = _tiny_problem()
    optimizer = factory.build(list(model.parameters()), section)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise fail(OPTIMIZER, "build", f"returned {type(optimizer).__name__}, expected a torch.optim.Optimizer")
    start = loss_fn().item()
    for _ in range(20):
        optimizer.zero_grad()
        loss_fn().backward()
        optimizer.step()
    if not all(torch.isfinite(p).all() for p in model.parameters()):
        raise fail(OPTIMIZER, "steps", "weights are not finite after 20 steps")
    if not loss_fn().item() < start:
        raise fail(OPTIMIZER, "steps", f"20 steps at lr 1e-2 did not lower a regression loss ({start:.4f} -> {loss_fn().item():.4f})")
    check_picklable(OPTIMIZER, factory)


def _trained_section() -> Any:
    return ppo_config().actor


def check_scheduler(factory: Any, section: Any = None, num_training_steps: int = 20) -> None:
    """``build`` gives an LR scheduler whose rate stays finite and ≥ 0 over every training step and
    whose state survives ``state_dict``/``load_state_dict`` (checkpoints); picklable."""
    import math

    import torch

    section = section if section is not None else _trained_section()
    model, _ = _tiny_problem()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    scheduler = factory.build(optimizer, num_training_steps, section)
    rates = []
    for _ in range(num_training_steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    bad = [(i, r) for i, r in enumerate(rates) if not (math.isfinite(r) and r >= 0)]
    if bad:
        raise fail(SCHEDULER, "finite non-negative rate", f"step {bad[0][0]} has lr {bad[0][1]}", f"{num_training_steps} steps")
    try:
        scheduler.load_state_dict(scheduler.state_dict())
    except Exception as exc:  # noqa: BLE001
        raise fail(SCHEDULER, "checkpointable", f"state_dict round trip raised {type(exc).__name__}: {exc}") from None
    check_picklable(SCHEDULER, factory)


class OptimizerKit(ContractProperties, ComponentKit):
    kind = ComponentKind.OPTIMIZER
    contract_properties = ("deepspeed_config", "build", "steps", "picklable for Ray",)

    @not_collected
    def test_contract(self) -> None:
        check_optimizer(self.make_component())

    def test_plan_state_bytes(self) -> None:
        check_optimizer_plan(self.make_component())


class SchedulerKit(ContractProperties, ComponentKit):
    kind = ComponentKind.SCHEDULER
    contract_properties = ("finite non-negative rate", "checkpointable", "picklable for Ray",)

    @not_collected
    def test_contract(self) -> None:
        check_scheduler(self.make_component())


# ------------------------------------------------------------------ model loaders and processors


def check_model_loader(loader: Any, model_path: Any, role: str = "actor", config: Any = None) -> None:
    """``load(path, role, config)`` gives a torch module whose forward pass on a few token ids is finite; picklable."""
    import torch

    model = loader.load(str(model_path), role, config if config is not None else ppo_config())
    if not isinstance(model, torch.nn.Module):
        raise fail(LOADER, "load", f"returned {type(model).__name__}, expected a torch.nn.Module", f"role {role!r}")
    with torch.no_grad():
        output = model(input_ids=torch.tensor([[1, 5, 9, 2]]))
    logits = getattr(output, "logits", output)
    if not torch.isfinite(logits).all():
        raise fail(LOADER, "forward", "the loaded model's output is not finite", f"role {role!r}, input_ids [[1, 5, 9, 2]]")
    check_picklable(LOADER, loader)


def check_processor(processor: Any, rows: list[dict[str, Any]]) -> None:
    """``process(row)`` gives a dict with ``prompt_ids`` (a non-empty list of ints), deterministic; picklable."""

    def case(row: dict[str, Any]) -> Any:
        def check() -> str | None:
            out = processor.process(dict(row))
            ids = out.get("prompt_ids") if isinstance(out, dict) else None
            if not isinstance(ids, list) or not ids or not all(isinstance(t, int) for t in ids):
                return f"returned {show(out)}, expected a dict with prompt_ids: a non-empty list of ints"
            if processor.process(dict(row)) != out:
                return "two calls on the same row differ (not deterministic)"
            return None

        return f"row {show(row)}", check

    first_failure(PROCESSOR, "process", [case(row) for row in rows])
    check_picklable(PROCESSOR, processor)


class ModelLoaderKit(ContractProperties, ComponentKit):
    """Uses the ``tiny_causal_lm_path`` fixture of the testing kit (a random 2-layer Llama, built offline)."""

    kind = ComponentKind.MODEL_LOADER
    contract_properties = ("load", "forward", "picklable for Ray",)

    @not_collected
    def test_contract(self, tiny_causal_lm_path: Any) -> None:
        check_model_loader(self.make_component(), tiny_causal_lm_path)


class ProcessorKit(ContractProperties, ComponentKit):
    """Override :meth:`rows` with dataset rows your processor understands."""

    kind = ComponentKind.PROCESSOR
    contract_properties = ("process", "picklable for Ray",)

    def rows(self) -> list[dict[str, Any]]:
        return [{"input": "what is 2+3?"}, {"input": ""}, {"input": "a longer prompt with several words in it"}]

    @not_collected
    def test_contract(self) -> None:
        check_processor(self.make_component(), self.rows())
