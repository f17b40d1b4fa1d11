"""One test per hook: a plugin implementing it is called as the spec documents."""

from __future__ import annotations

import re
import types
from pathlib import Path

import pytest

import rlhf
from rlhf.host.plugin_host import PluginHost, PluginLoadError
from rlhf.registry import ComponentError, ComponentKind


class Component:
    """A stand-in component object; registration only stores and returns it."""


def plugin_with(hook_name: str, body) -> types.SimpleNamespace:
    body.__name__ = hook_name
    return types.SimpleNamespace(rlhf_plugin_api=rlhf.PLUGIN_API_VERSION, **{hook_name: rlhf.hookimpl(body)})


def check_registration(kind: ComponentKind, plugin_host: PluginHost, register_plugin) -> None:
    """Objects and lazy strings register, load on demand, and duplicates blame the second plugin."""

    def register_both(register):
        register("direct", Component, description="an object")
        register("lazy", "tests_lazy_target:Thing")

    record = register_plugin(plugin_with(kind.hook_name, register_both), name="maker")
    assert record.components == {kind.value: ["direct", "lazy"]}
    assert plugin_host.registry.get(kind, "direct") is Component
    with pytest.raises(ComponentError, match="cannot import 'tests_lazy_target'"):
        plugin_host.registry.get(kind, "lazy")
    with pytest.raises(PluginLoadError, match=f"{kind.label} 'direct' is registered by both plugin 'maker' and plugin 'copycat'"):
        register_plugin(plugin_with(kind.hook_name, lambda register: register("direct", Component)), name="copycat")
    assert plugin_host.registry.registration(kind, "direct").plugin == "maker"


def test_hook_rlhf_register_advantage_estimators(plugin_host, register_plugin) -> None:
    check_registration(ComponentKind.ADVANTAGE_ESTIMATOR, plugin_host, register_plugin)


def test_hook_rlhf_register_policy_losses(plugin_host, register_plugin) -> None:
    check_registration(ComponentKind.POLICY_LOSS, plugin_host, register_plugin)


def test_hook_rlhf_register_kl_estimators(plugin_host, register_plugin) -> None:
    check_registration(ComponentKind.KL_ESTIMATOR, plugin_host, register_plugin)


def test_hook_rlhf_register_sample_filters(plugin_host, register_plugin) -> None:
    check_registration(ComponentKind.SAMPLE_FILTER, plugin_host, register_plugin)


def test_hook_rlhf_register_trainers(plugin_host, register_plugin) -> None:
    assert plugin_host.registry.names(ComponentKind.TRAINER) == ["ppo"]  # the core's own
    check_registration(ComponentKind.TRAINER, plugin_host, register_plugin)


def test_hook_rlhf_register_commands(plugin_host, register_plugin) -> None:
    check_registration(ComponentKind.COMMAND, plugin_host, register_plugin)


def test_hook_rlhf_register_rollout_engines(plugin_host, register_plugin) -> None:
    check_registration(ComponentKind.ROLLOUT_ENGINE, plugin_host, register_plugin)


def test_hook_rlhf_register_weight_sync_transports(plugin_host, register_plugin) -> None:
    check_registration(ComponentKind.WEIGHT_SYNC_TRANSPORT, plugin_host, register_plugin)


def test_hook_rlhf_register_training_backends(plugin_host, register_plugin) -> None:
    check_registration(ComponentKind.TRAINING_BACKEND, plugin_host, register_plugin)


def test_hook_rlhf_register_rollout_schedulers(plugin_host, register_plugin) -> None:
    check_registration(ComponentKind.ROLLOUT_SCHEDULER, plugin_host, register_plugin)


def test_hook_rlhf_register_reward_functions(plugin_host, register_plugin) -> None:
    check_registration(ComponentKind.REWARD_FUNCTION, plugin_host, register_plugin)


def test_hook_rlhf_register_rollout_corrections(plugin_host, register_plugin) -> None:
    check_registration(ComponentKind.ROLLOUT_CORRECTION, plugin_host, register_plugin)


def test_hook_rlhf_register_reward_managers(plugin_host, register_plugin) -> None:
    check_registration(ComponentKind.REWARD_MANAGER, plugin_host, register_plugin)


def test_hook_rlhf_register_reward_shapers(plugin_host, register_plugin) -> None:
    check_registration(ComponentKind.REWARD_SHAPER, plugin_host, register_plugin)


def test_hook_rlhf_register_agent_executors(plugin_host, register_plugin) -> None:
    check_registration(ComponentKind.AGENT_EXECUTOR, plugin_host, register_plugin)


def test_hook_rlhf_register_prompt_sources(plugin_host, register_plugin) -> None:
    check_registration(ComponentKind.PROMPT_SOURCE, plugin_host, register_plugin)


def test_hook_rlhf_register_model_loaders(plugin_host, register_plugin) -> None:
    check_registration(ComponentKind.MODEL_LOADER, plugin_host, register_plugin)


def test_hook_rlhf_register_processors(plugin_host, register_plugin) -> None:
    check_registration(ComponentKind.PROCESSOR, plugin_host, register_plugin)


def test_hook_rlhf_register_optimizers(plugin_host, register_plugin) -> None:
    check_registration(ComponentKind.OPTIMIZER, plugin_host, register_plugin)


def test_hook_rlhf_register_schedulers(plugin_host, register_plugin) -> None:
    check_registration(ComponentKind.SCHEDULER, plugin_host, register_plugin)


def test_hook_rlhf_register_presets(plugin_host, register_plugin) -> None:
    check_registration(ComponentKind.PRESET, plugin_host, register_plugin)


def test_hook_rlhf_register_options(plugin_host, register_plugin) -> None:
    from pydantic import BaseModel

    class Opts(BaseModel):
        level: int = 3

    record = register_plugin(plugin_with("rlhf_register_options", lambda register: register(Opts)), name="leveller")
    assert record.options == ["leveller"]
    assert plugin_host.options["leveller"].model_class() is Opts
    with pytest.raises(PluginLoadError, match="must be a Python identifier"):
        register_plugin(plugin_with("rlhf_register_options", lambda register: register(Opts, namespace="a-b")), name="bad")


def test_a_raising_registration_hook_fails_only_its_plugin(plugin_host, register_plugin) -> None:
    def explode(register):
        register("half", Component)
        raise RuntimeError("boom")

    with pytest.raises(PluginLoadError, match="rlhf_register_optimizers raised RuntimeError: boom"):
        register_plugin(plugin_with("rlhf_register_optimizers", explode), name="exploder")
    assert "half" not in plugin_host.registry.names(ComponentKind.OPTIMIZER)  # rolled back


class Recorder:
    """Implements every lifecycle hook and records the calls."""

    rlhf_plugin_api = rlhf.PLUGIN_API_VERSION

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict]] = []

    @rlhf.hookimpl
    def rlhf_worker_init(self, role, rank, config):
        self.calls.append(("worker_init", {"role": role, "rank": rank, "config": config}))

    @rlhf.hookimpl
    def rlhf_train_start(self, config, run_dir):
        self.calls.append(("train_start", {"config": config, "run_dir": run_dir}))

    @rlhf.hookimpl
    def rlhf_step_end(self, step, metrics):
        self.calls.append(("step_end", {"step": step, "metrics": metrics}))

    @rlhf.hookimpl
    def rlhf_train_end(self, config, run_dir, status):
        self.calls.append(("train_end", {"status": status}))

    @rlhf.hookimpl
    def rlhf_checkpoint_save(self, step, checkpoint_dir, state):
        state["recorder"] = {"seen": step}
        (checkpoint_dir / "recorder.txt").write_text(str(step))

    @rlhf.hookimpl
    def rlhf_checkpoint_load(self, step, checkpoint_dir, state):
        self.calls.append(("checkpoint_load", {"step": step, "state": state}))


@pytest.fixture
def recorder(register_plugin) -> Recorder:
    rec = Recorder()
    record = register_plugin(rec, name="recorder")
    assert len(record.hooks) == 6
    return rec


def test_hook_rlhf_worker_init(plugin_host, recorder) -> None:
    plugin_host.worker_init("actor", 3, {"k": 1})
    assert recorder.calls == [("worker_init", {"role": "actor", "rank": 3, "config": {"k": 1}})]


def test_hook_rlhf_train_start(plugin_host, recorder, tmp_path: Path) -> None:
    plugin_host.train_start("cfg", tmp_path)
    assert recorder.calls == [("train_start", {"config": "cfg", "run_dir": tmp_path})]


def test_hook_rlhf_step_end(plugin_host, recorder) -> None:
    for step in (1, 2):
        plugin_host.step_end(step, {"reward": 0.5 * step})
    assert [c[1] for c in recorder.calls] == [{"step": 1, "metrics": {"reward": 0.5}}, {"step": 2, "metrics": {"reward": 1.0}}]


def test_hook_rlhf_train_end(plugin_host, recorder, tmp_path: Path) -> None:
    plugin_host.train_end("cfg", tmp_path, "failed")
    assert recorder.calls == [("train_end", {"status": "failed"})]


def test_hook_rlhf_checkpoint_save(plugin_host, recorder, tmp_path: Path) -> None:
    state: dict = {}
    plugin_host.checkpoint_save(7, tmp_path, state)
    assert state == {"recorder": {"seen": 7}}
    assert (tmp_path / "recorder.txt").read_text() == "7"


def test_hook_rlhf_checkpoint_load(plugin_host, recorder, tmp_path: Path) -> None:
    plugin_host.checkpoint_load(7, tmp_path, {"recorder": {"seen": 7}})
    assert recorder.calls == [("checkpoint_load", {"step": 7, "state": {"recorder": {"seen": 7}}})]


def test_hooks_are_not_called_on_failed_plugins(plugin_host, register_plugin) -> None:
    seen = []

    class Failing(Recorder):
        rlhf_plugin_api = 42

        @rlhf.hookimpl
        def rlhf_step_end(self, step, metrics):
            seen.append(step)

    with pytest.raises(PluginLoadError, match="needs plugin API 42"):
        register_plugin(Failing(), name="failing")
    plugin_host.step_end(1, {})
    assert seen == []


def test_a_raising_lifecycle_hook_is_a_plugin_error_naming_plugin_and_hook(plugin_host, register_plugin, recorder,
                                                                          tmp_path: Path) -> None:
    from rlhf.errors import PluginError

    class Faulty:
        rlhf_plugin_api = rlhf.PLUGIN_API_VERSION

        @rlhf.hookimpl
        def rlhf_train_end(self, config, run_dir, status):
            raise OSError("disk quota")

    register_plugin(Faulty(), name="faulty-observer")
    with pytest.raises(PluginError, match=r"plugin 'faulty-observer' failed in its rlhf_train_end hook: OSError: disk quota; "
                                          r"fix the plugin or remove faulty-observer from --plugins"):
        plugin_host.train_end("cfg", tmp_path, "completed")
    plugin_host.step_end(1, {})  # the other hooks, and the other plugin's, still work
    assert recorder.calls[-1][0] == "step_end"


def test_hook_rlhf_steer(plugin_host, register_plugin) -> None:
    """Each plugin gets its own handle (requests name their plugin); a bad request blames its plugin."""
    from rlhf.errors import PluginError
    from rlhf.steering import SteeringView

    class Curriculum:
        rlhf_plugin_api = rlhf.PLUGIN_API_VERSION

        @rlhf.hookimpl
        def rlhf_steer(self, step, metrics, steering):
            if metrics["reward"] > 0.5:
                steering.set_prompt_weights([1, 3])
                steering.set_coefficient("kl", 0.0)

    class Stopper:
        rlhf_plugin_api = rlhf.PLUGIN_API_VERSION

        @rlhf.hookimpl
        def rlhf_steer(self, step, steering):
            if step >= 3:
                steering.stop("enough")
                steering.save_checkpoint()

    register_plugin(Curriculum(), name="curriculum")
    register_plugin(Stopper(), name="stopper")
    view = SteeringView(prompt_datasets=("easy.jsonl", "hard.jsonl"), prompt_weights=(0.5, 0.5),
                        coefficients={"kl": 0.01, "entropy": 0.0, "lr_scale": 1.0})
    handles = plugin_host.steer(3, {"reward": 0.9}, view)
    assert [h.plugin for h in handles] == ["stopper", "curriculum"]  # pluggy's order: the last registered first
    second, first = handles
    assert (first.plugin, first.prompt_weights, first.coefficients, first.stop_reason) == (
        "curriculum", (0.25, 0.75), {"kl": 0.0}, None)
    assert (second.plugin, second.stop_reason, second.checkpoint_reason, second.prompt_weights) == (
        "stopper", "enough", "requested", None)
    quiet = plugin_host.steer(1, {"reward": 0.1}, view)
    assert [h.prompt_weights or h.stop_reason for h in quiet] == [None, None]

    class Wrong:
        rlhf_plugin_api = rlhf.PLUGIN_API_VERSION

        @rlhf.hookimpl
        def rlhf_steer(self, steering):
            steering.set_prompt_weights([1.0])

    register_plugin(Wrong(), name="wrong")
    with pytest.raises(PluginError, match=r"plugin 'wrong' failed in its rlhf_steer hook: ValueError: set_prompt_weights "
                                          r"got 1 weights for 2 prompt datasets \(easy.jsonl, hard.jsonl\)"):
        plugin_host.steer(1, {"reward": 0.1}, view)


@pytest.mark.parametrize("bad,message", [
    (lambda s: s.set_coefficient("temperature", 1.0), "unknown coefficient 'temperature'; steerable: kl, entropy, lr_scale"),
    (lambda s: s.set_coefficient("kl", float("nan")), "must be finite and >= 0"),
    (lambda s: s.set_prompt_weights([0, 0]), "not all 0"),
    (lambda s: s.stop(""), "needs a non-empty reason"),
])
def test_a_steering_request_out_of_range_is_refused(bad, message) -> None:
    from rlhf.steering import Steering, SteeringView

    handle = Steering("p", SteeringView(("a", "b"), (0.5, 0.5), {"kl": 0.0, "entropy": 0.0, "lr_scale": 1.0}))
    with pytest.raises(ValueError, match=re.escape(message)):
        bad(handle)


def test_hook_rlhf_translate_argv(plugin_host, register_plugin) -> None:
    """Each plugin rewrites the previous one's result (pluggy's order: the last registered first); None leaves
    the command line; a ConfigError is the user's one line as raised; any other failure blames its plugin."""
    from rlhf.errors import ConfigError, PluginError

    seen = []

    def shorthand(command, argv, known_flags, config_class):
        seen.append(("shorthand", command, list(argv), config_class))
        return ["--long" if token == "--short" else token for token in argv]

    def audit(argv):
        seen.append(("audit", list(argv)))
        if "--gone" in argv:
            raise ConfigError("--gone is no longer supported: use --long")

    register_plugin(plugin_with("rlhf_translate_argv", audit), name="audit")
    register_plugin(plugin_with("rlhf_translate_argv", shorthand), name="shorthand")
    out = plugin_host.translate_argv("train ppo", ["--short", "3"], ["--long"], dict)
    assert out == ["--long", "3"]
    assert seen == [("shorthand", "train ppo", ["--short", "3"], dict), ("audit", ["--long", "3"])]
    with pytest.raises(ConfigError, match=r"^--gone is no longer supported: use --long$"):
        plugin_host.translate_argv("generate", ["--gone"], [], None)

    def broken(argv):
        return argv[99]

    register_plugin(plugin_with("rlhf_translate_argv", broken), name="broken")
    with pytest.raises(PluginError, match=r"plugin 'broken' failed in its rlhf_translate_argv hook: IndexError"):
        plugin_host.translate_argv("train ppo", [], [], None)


def test_hook_rlhf_rollout_samples(plugin_host, register_plugin) -> None:
    """The records the controller hands the hook carry each sample's values, reduced as COLUMNS documents."""
    import random

    from rlhf.runtime.control.sample_records import sample_records
    from rlhf.runtime.workers.batch import Sample

    rng = random.Random(0)
    seen = []
    register_plugin(plugin_with("rlhf_rollout_samples", lambda step, kind, samples: seen.append((step, kind, samples))),
                    name="watcher")
    mask = [1, 1, 0, 0, 1]  # two model turns around environment feedback
    sample = Sample(prompt_ids=[1, 2], response_ids=[3, 4, 5, 6, 7], rollout_logprobs=[rng.uniform(-3, 0) for _ in mask],
                    prompt="p", response="r", label={"answer": 4}, group=2, finish_reason="length", reward=0.7,
                    action_mask=mask, terms={"math": 1.0}, columns={"code/output": "2 passed"}, policy_version=3)
    advantages, returns = [[rng.gauss(0, 1) for _ in mask]], [[rng.gauss(0, 1) for _ in mask]]
    trainer = [[rng.uniform(-3, 0) for _ in mask]]
    records = sample_records([sample], 9, advantages, returns, trainer)
    plugin_host.rollout_samples(9, "train", records)
    [(step, kind, [record])] = seen
    assert (step, kind) == (9, "train")
    model = [i for i, m in enumerate(mask) if m]
    assert record["advantage"] == pytest.approx(sum(advantages[0][i] for i in model) / 3)
    assert record["logprob_mismatch"] == pytest.approx(
        sum(abs(trainer[0][i] - sample.rollout_logprobs[i]) for i in model) / 3)
    assert record["return"] == returns[0][0] and record["turns"] == 2 and record["response_length"] == 5
    assert (record["reward/math"], record["extra/code/output"], record["label"]) == (1.0, "2 passed", '{"answer": 4}')
    assert (record["group"], record["policy_version"], record["finish_reason"]) == (2, 3, "length")
    [evaluated] = sample_records([sample], 9)
    assert evaluated["advantage"] is None and evaluated["trainer_logprobs"] is None and evaluated["logprob_mismatch"] is None
