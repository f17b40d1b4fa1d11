"""Kits for the systems components: rollout engines and weight-sync transports.

The engine kit builds the engine on a tiny offline model (``tiny_causal_lm_path``) in the test
process and checks it against a plain ``transformers`` forward of the same weights: the log-probs
it reports are those of the distribution it sampled (temperature-scaled), also where the model's
``generation_config.json`` sets penalties, top-k and a temperature of its own (an engine samples the
policy at the run's settings and ignores them; its samples vary with the seed), a weight load replaces
every weight, sleep/wake leave it generating; an in-rank engine is attached to a whole trained model
and must follow that model's weights as they move in place, and put its prompts on that model's device
(checked on a simulated accelerator, :mod:`rlhf.testing.accelerator`). The transport kit checks the traits ``auto`` reads.
"""

from __future__ import annotations

import contextlib
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from rlhf.components import build
from rlhf.components.first_use import ComponentLabel, raised_by_library, refusal
from rlhf.host.plugin_host import PluginHost
from rlhf.host.selection import PluginSelection
from rlhf.registry import ComponentKind
from rlhf.testing.accelerator import put_on_accelerator, simulated_accelerator
from rlhf.testing.conformance._core import (
    ComponentKit,
    ContractProperties,
    check_picklable,
    fail,
    first_failure,
    not_collected,
    ppo_config,
)
from rlhf.testing.conformance.planning import check_engine_plan, check_engine_remedies

ENGINE = ComponentKind.ROLLOUT_ENGINE.label
TRANSPORT = ComponentKind.WEIGHT_SYNC_TRANSPORT.label
#: fp32 log-prob tolerance between an engine and a plain transformers forward
LOGPROB_TOLERANCE = 1e-3


def _reference_logprobs(model: Any, prompt: list[int], response: list[int], temperature: float) -> list[float]:
    import torch

    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1: -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(response)[:, None])[:, 0].tolist()


#: what the engine kit's model ships in its ``generation_config.json``, as published chat models do: every key would
#: change what ``generate`` samples or the log-probs it reports, and an engine must ignore them all
CHECKPOINT_SAMPLING_DEFAULTS = {"repetition_penalty": 1.5, "no_repeat_ngram_size": 2, "top_k": 1, "temperature": 0.3,
                                "top_p": 0.5, "suppress_tokens": list(range(10, 200)), "do_sample": True}


@contextlib.contextmanager
def with_sampling_defaults(model_path: Any) -> Iterator[Path]:
    """A model directory with every file of ``model_path`` and a ``generation_config.json`` that adds
    :data:`CHECKPOINT_SAMPLING_DEFAULTS` to the one it has, removed afterwards."""
    source = Path(model_path)
    with tempfile.TemporaryDirectory(prefix="rlhf-kit-model-") as folder:
        target = Path(folder)
        for file in source.iterdir():
            if file.name != "generation_config.json":
                (target / file.name).symlink_to(file.resolve())
        shipped = source / "generation_config.json"
        fields = json.loads(shipped.read_text()) if shipped.is_file() else {}
        (target / "generation_config.json").write_text(json.dumps({**fields, **CHECKPOINT_SAMPLING_DEFAULTS}))
        yield target


def _far(got: list[float], want: list[float]) -> float:
    return max((abs(a - b) for a, b in zip(got, want)), default=0.0)


def check_rollout_engine(engine_class: type, model_path: Any, config: dict[str, Any] | None = None) -> None:
    """Build ``engine_class`` on the tiny model at ``model_path`` and check the protocol's contract."""
    _check_rollout_engine(engine_class, model_path, config, engine_class.__name__)


def _check_rollout_engine(engine_class: type, model_path: Any, config: dict[str, Any] | None, name: str) -> None:
    """The contract on ``model_path``'s weights, with a ``generation_config.json`` that sets penalties, top-k and a
    temperature (:data:`CHECKPOINT_SAMPLING_DEFAULTS`): the engine samples the plain policy all the same."""
    with with_sampling_defaults(model_path) as shipped:
        _check_engine_on(engine_class, shipped, config, name)


def _built(engine_class: type, model_path: Any, config: dict[str, Any], name: str) -> Any:
    """The engine, built as the core builds it: a construction that raises is a failure naming the engine by
    ``name``, with the line a user would read when the library under it refuses (its ``error_hint`` included, else
    the other installed engines)."""
    try:
        return engine_class(str(model_path), "fp32", 128, 0, config)
    except Exception as exc:  # noqa: BLE001 - the engine's own error is the finding
        label = ComponentLabel.among(ENGINE, name, "--rollout.engine", _installed_engines())
        detail = str(refusal(exc, label, engine_class, "while it was built")) if raised_by_library(exc, engine_class) \
            else f"{label.describe(engine_class)} raised {type(exc).__name__}: {exc}"
        raise fail(ENGINE, "construction", detail, "the tiny model, fp32, max_model_len 128") from None


def _installed_engines() -> list[str]:
    """The rollout engines the installed plugins register, as a run's way out names them."""
    return PluginHost.load(PluginSelection(origin="conformance kit")).registry.names(ComponentKind.ROLLOUT_ENGINE)


def _check_engine_on(engine_class: type, model_path: Any, config: dict[str, Any] | None, name: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    if not isinstance(getattr(engine_class, "in_training_rank", None), bool):
        raise fail(ENGINE, "traits", "in_training_rank must be a bool class attribute")
    check_picklable(ENGINE, engine_class)
    config = config or ppo_config().model_dump(mode="json")
    engine = _built(engine_class, model_path, config, name)
    reference = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32).eval()
    trained = None
    if engine_class.in_training_rank:  # it generates with the rank's trained model: here, an unsharded one
        trained = WholeTrainedModel(AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32))
        engine.attach(trained)
    requests = [{"prompt_ids": [5, 40, 41, 42], "max_tokens": 6, "seed": 3},
                {"prompt_ids": [7, 8], "max_tokens": 1, "seed": 4},
                {"prompt_ids": [9, 10, 11, 12, 13, 14, 15], "max_tokens": 9, "seed": 5}]

    def shape_of(results: list[dict[str, Any]]) -> str | None:
        if len(results) != len(requests):
            return f"{len(results)} results for {len(requests)} requests"
        for request, result in zip(requests, results):
            ids, logprobs = result.get("response_ids"), result.get("logprobs")
            if not isinstance(ids, list) or not all(isinstance(t, int) for t in ids) or not 0 < len(ids) <= request["max_tokens"]:
                return f"response_ids {ids!r} is not a list of 1..max_tokens ints"
            if not isinstance(logprobs, list) or len(logprobs) != len(ids):
                return f"{len(logprobs or [])} logprobs for {len(ids)} tokens"
            if result.get("finish_reason") not in ("stop", "length"):
                return f"finish_reason {result.get('finish_reason')!r}"
            if result["finish_reason"] == "length" and len(ids) != request["max_tokens"]:
                return f"finish_reason 'length' after {len(ids)} of {request['max_tokens']} tokens"
        return None

    def sampled_distribution() -> str | None:
        for temperature in (1.0, 0.7):
            results = engine.generate(requests, temperature, 1.0)
            problem = shape_of(results)
            if problem:
                return problem
            for request, result in zip(requests, results):
                want = _reference_logprobs(reference, request["prompt_ids"], result["response_ids"], temperature)
                if _far(result["logprobs"], want) > LOGPROB_TOLERANCE:
                    return (f"at temperature {temperature} the logprobs {[round(x, 4) for x in result['logprobs']]} are not "
                            f"the sampled distribution's {[round(x, 4) for x in want]} (logits / temperature)")
        return None

    def seeded() -> str | None:
        first, second = (engine.generate(requests[:1], 1.0, 1.0)[0]["response_ids"] for _ in range(2))
        return None if first == second else f"the same request and seed gave {first} then {second}"

    def varied() -> str | None:
        """One prompt under eight seeds at temperature 1: a checkpoint's top-k 1 or low temperature would make every
        sample the same (the tiny model's distribution is nearly flat, so eight equal ones are all but impossible)."""
        samples = {tuple(result["response_ids"]) for result in engine.generate(
            [{**requests[0], "seed": seed} for seed in range(8)], 1.0, 1.0)}
        return None if len(samples) > 1 else f"eight seeds gave the same response {list(samples.pop())}"

    def empty() -> str | None:
        return None if engine.generate([], 1.0, 1.0) == [] else "an empty request list must give []"

    probe = [5, 40, 41, 42, 43, 44]

    def sequence_logprobs() -> str | None:
        got = engine.sequence_logprobs(probe)
        want = _reference_logprobs(reference, probe[:1], probe[1:], 1.0)
        return None if len(got) == len(want) and _far(got, want) <= LOGPROB_TOLERANCE else f"{got} != {want}"

    def weights() -> str | None:
        torch.manual_seed(0)
        with torch.no_grad():  # through the parameters, so tied weights (embeddings, lm_head) stay tied
            for parameter in reference.parameters():
                parameter.add_(0.05 * torch.randn_like(parameter))
        state = {name: tensor.clone() for name, tensor in reference.state_dict().items()}
        engine.wake_up(["weights"])
        engine.load_weights(state)
        engine.sleep()
        engine.wake_up(None)
        difference, compared = engine.max_weight_difference(state)
        if compared < 1 or difference > 1e-6:
            return f"after load_weights, max_weight_difference gives ({difference}, {compared}), expected (0, >= 1)"
        return sequence_logprobs() or shape_of(engine.generate(requests, 1.0, 1.0))

    first_failure(ENGINE, "generate", [("three requests of 1-9 tokens", lambda: shape_of(engine.generate(requests, 1.0, 1.0))),
                                       ("no request", empty)])
    first_failure(ENGINE, "log-probs of the sampled distribution",
                  [("temperatures 1.0 and 0.7, the checkpoint's generation_config.json setting penalties", sampled_distribution)])
    first_failure(ENGINE, "seeded sampling", [("one request twice, seed 3", seeded),
                                              ("one request under seeds 0-7, the checkpoint asking for top-k 1", varied)])
    first_failure(ENGINE, "sequence_logprobs", [(f"token ids {probe}", sequence_logprobs)])
    first_failure(ENGINE, "load_weights", [("every weight perturbed, with a sleep/wake around", weights)])
    if trained is not None:

        def on_its_device() -> str | None:
            """The rank's model on a simulated accelerator (rlhf.testing.accelerator): the engine must put its prompts
            on the model's device and hand back plain lists, as a GPU demands."""
            elsewhere = _built(engine_class, model_path, config, name)
            with simulated_accelerator():
                elsewhere.attach(put_on_accelerator(WholeTrainedModel(
                    AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32))))
                results = elsewhere.generate(requests, 1.0, 1.0)
            return shape_of(results)

        first_failure(ENGINE, "inputs on the trained model's device",
                      [("three requests, the attached model on a simulated accelerator", on_its_device)])
    if trained is not None and getattr(engine_class, "shares_trained_weights", False):

        def shared() -> str | None:
            with torch.no_grad():  # a training step, as the trainer takes it: in place, no load_weights
                for parameter, moved in zip(trained.module.parameters(), reference.parameters()):
                    parameter.add_(0.05 * torch.randn_like(parameter))
                    moved.copy_(parameter)
            return sequence_logprobs()

        first_failure(ENGINE, "generates with the attached model's weights",
                      [("every trained weight moved in place after attach", shared)])


class WholeTrainedModel:
    """What the engine kit attaches an in-rank engine to: a training backend's model whose parameters are
    whole in this process (ZeRO 0-2 on one rank), with the :class:`rlhf.components.TrainedModel` members an
    engine reads."""

    def __init__(self, module: Any) -> None:
        self.module, self.device = module, module.device

    def gathered(self) -> Any:
        import contextlib

        return contextlib.nullcontext()


class RolloutEngineKit(ContractProperties, ComponentKit):
    """``component``: the engine class. Uses the ``tiny_causal_lm_path`` fixture of ``rlhf.testing``."""

    kind = ComponentKind.ROLLOUT_ENGINE
    contract_properties = ("traits", "picklable for Ray", "construction", "generate", "log-probs of the sampled distribution",
                           "seeded sampling", "sequence_logprobs", "load_weights")

    def properties(self) -> tuple[str, ...]:
        """An engine in the training ranks is also checked on the trained model's device, and one that generates with
        the rank's own weights follows them as they move."""
        extra = ()
        if getattr(self.component, "in_training_rank", False) is True:
            extra += ("inputs on the trained model's device",)
            if getattr(self.component, "shares_trained_weights", False):
                extra += ("generates with the attached model's weights",)
        return self.contract_properties + extra

    def engine_config(self) -> dict[str, Any]:
        """The dumped config the engine is built with; override to set its options."""
        return self.run_config().model_dump(mode="json")

    def test_picklable(self) -> None:
        check_picklable(self.kind.label, self.component)

    @not_collected
    def test_contract(self, tiny_causal_lm_path: Any) -> None:
        _check_rollout_engine(self.component, tiny_causal_lm_path, self.engine_config(),
                              self.registered_name or self.component.__name__)

    def test_plan_memory(self) -> None:
        check_engine_plan(self.component, self.run_config())

    def test_plan_remedies(self) -> None:
        check_engine_remedies(self.component, self.run_config())


def check_weight_sync_transport(transport_class: type, config: Any = None) -> None:
    """The traits ``auto`` reads, and an instance that pickles (it travels to every rank and engine)."""

    if not isinstance(getattr(transport_class, "auto_preference", None), int):
        raise fail(TRANSPORT, "traits", "auto_preference must be an int class attribute")
    config = config if config is not None else ppo_config()
    for cuda in (False, True):
        reason = transport_class.unavailable_reason(config, cuda)
        if reason is not None and not (isinstance(reason, str) and reason):
            raise fail(TRANSPORT, "unavailable_reason", f"returned {reason!r}: None or a non-empty reason",
                       f"the default config, cuda={cuda}")
    transport = check_picklable(TRANSPORT, build(transport_class, config))
    for method in ("connect", "sync"):
        if not callable(getattr(transport, method, None)):
            raise fail(TRANSPORT, "methods", f"no {method}(actor, engines) method")


class WeightSyncTransportKit(ContractProperties, ComponentKit):
    """``component``: the transport class. The sync itself is checked end to end by a run (docs/plugins)."""

    kind = ComponentKind.WEIGHT_SYNC_TRANSPORT
    contract_properties = ("traits", "unavailable_reason", "picklable for Ray", "methods",)

    def test_picklable(self) -> None:
        check_picklable(self.kind.label, self.make_component())

    @not_collected
    def test_contract(self) -> None:
        check_weight_sync_transport(self.component, self.run_config())
