"""The `rlhf train ppo` config: OpenRLHF flag compatibility, YAML, errors, rules, plugin options."""

from __future__ import annotations

import ast
import json
import logging
import math
import types
from pathlib import Path

import pytest
import yaml
from pydantic import BaseModel, Field

import rlhf
from rlhf.config.base import ConfigError
from rlhf.config.loading import ConfigParser
from rlhf.config.ppo import PPOConfig
from rlhf.host.plugin_host import PluginHost, PluginLoadError
from rlhf.host.selection import PluginSelection
from rlhf.registry import ComponentKind as K
from rlhf.registry import ComponentRegistry
from rlhf.runtime.control.trainer import PPOTrainer

FLAGS = json.loads((Path(__file__).parent / "data" / "openrlhf_train_ppo_flags.json").read_text())


@pytest.fixture(autouse=True)
def _lift_refusals(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests check parsing and OpenRLHF's cross-flag rules, which hold whether or not this runtime
    runs an option yet; refusing options is tests/test_option_coverage.py's subject."""
    monkeypatch.setattr("rlhf.config.refused.REFUSED", {})


@pytest.fixture(scope="module")
def host() -> PluginHost:
    return PluginHost.load(PluginSelection.parse("ppo,grpo,adamw,kl,deepspeed,async-rollout,weighted-rewards,rollout-correction", strict=True))


def parse(host: PluginHost, *argv: str) -> PPOConfig:
    config, _ = ConfigParser(PPOConfig, host, prog="rlhf train ppo").parse(list(argv))
    return PPOTrainer.prepare_config(config, host)


def value_at(config: BaseModel, dotted: str):
    node = config
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def openrlhf_default(text: str):
    if text in {"None", "True", "False"}:
        return {"None": None, "True": True, "False": False}[text]
    if text == "inf":
        return math.inf
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def test_every_openrlhf_train_ppo_flag_is_accepted_with_its_default(host: PluginHost) -> None:
    parser = ConfigParser(PPOConfig, host, prog="rlhf train ppo")
    default = PPOConfig()
    assert len(FLAGS) == 167
    for row in FLAGS:
        flag = row["flag"]
        assert flag in parser.flags, f"{flag} is not accepted"
        if flag.endswith("no_nesterov"):
            continue  # a store_false switch for muon.nesterov, checked below
        ours = value_at(default, flag[2:])
        if flag == "--logger.wandb.run_name":
            assert ours.startswith("ppo_")
        elif flag == "--ds.lora.target_modules":
            assert ours == "all-linear"
        elif flag == "--ckpt.best_metric_key":
            assert ours == ""
        elif flag == "--vllm.sync_backend":
            assert ours == "auto"  # OpenRLHF's nccl where it can run; gloo on CPU, object_store with LoRA/AutoTP
        else:
            assert ours == openrlhf_default(row["default"]), flag


def test_flag_values_are_parsed_into_typed_fields(host: PluginHost) -> None:
    cfg = parse(
        host,
        "--actor.adam.lr", "3e-6", "--reward.clip_range", "-5", "5", "--actor.muon.no_nesterov",
        "--algo.advantage.is_correction_threshold", "2.0", "--ds.lora.target_modules", "q_proj", "v_proj",
        "--ref.offload", "--vllm.num_engines", "2", "--ds.param_dtype", "fp32",
    )
    assert cfg.actor.adam.lr == 3e-6 and cfg.reward.clip_range == [-5.0, 5.0]
    assert cfg.actor.muon.nesterov is False and cfg.critic.muon.nesterov is True
    assert cfg.algo.advantage.is_correction_threshold == [2.0]
    assert cfg.ds.lora.target_modules == ["q_proj", "v_proj"]
    assert cfg.ref.offload is True and cfg.vllm.num_engines == 2 and cfg.ds.param_dtype == "fp32"
    assert cfg.critic.adam.lr == 9e-6  # the critic keeps its own default


def test_yaml_holds_the_same_tree_and_flags_override_it(host: PluginHost, tmp_path: Path) -> None:
    run = tmp_path / "run.yaml"
    run.write_text(yaml.safe_dump({
        "actor": {"adam": {"lr": 5e-7}, "eps_clip": 0.3},
        "rollout.n_samples_per_prompt": 8,  # dotted keys are accepted too
        "algo": {"advantage": {"estimator": "group_norm"}},
    }))
    cfg = parse(host, "--config", str(run), "--actor.eps_clip", "0.25")
    assert cfg.actor.adam.lr == 5e-7 and cfg.actor.eps_clip == 0.25
    assert cfg.rollout.n_samples_per_prompt == 8 and cfg.algo.advantage.estimator == "group_norm"
    assert cfg.actor.eps_clip_low_high == [0.25, 0.25]


def test_printed_config_loads_back_identically(host: PluginHost, tmp_path: Path, capsys) -> None:
    from rlhf.cli.main import main

    assert main(["--plugins", "ppo,grpo,adamw,kl,deepspeed,weighted-rewards", "train", "ppo", "--print-config", "--actor.adam.lr", "2e-6"]) == 0
    dumped = capsys.readouterr().out
    (tmp_path / "dump.yaml").write_text(dumped)
    data = yaml.safe_load(dumped)
    assert data["ckpt"]["max_mem"] == math.inf
    assert [p["name"] for p in data["plugin_set"]] == ["core", "grpo", "kl", "ppo", "deepspeed", "adamw", "weighted-rewards"]
    reloaded = parse(host, "--config", str(tmp_path / "dump.yaml"))
    assert reloaded.actor.adam.lr == 2e-6 and reloaded.ckpt.max_mem == math.inf


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--actor.adam.lrr", "1"], "unknown flag --actor.adam.lrr; did you mean --actor.adam.lr?"),
        (["--rollout.n_sample_per_prompt", "2"], "did you mean --rollout.n_samples_per_prompt?"),
        (["--train.seed", "abc"], "--train.seed: Input should be a valid integer"),
        (["--ds.param_dtype", "fp8"], "invalid choice: 'fp8'"),
        (["--algo.advantage.estimator", "group_nrom", "--rollout.n_samples_per_prompt", "4"],
         "Did you mean 'group_norm'? Installed: gae, group_norm."),
        # installed, but out of this host's allow-list: the line says so and what to add
        (["--algo.advantage.estimator", "rloo"], "--algo.advantage.estimator 'rloo': that advantage estimator is installed "
         "(plugin 'rloo', rlhf-plugin-rloo) but not in the --plugins allow-list; add rloo to --plugins"),
        (["--actor.optim", "muon"], "--actor.optim 'muon': that optimizer is installed (plugin 'muon', rlhf-plugin-muon)"),
        # every registrable kind is chosen by name
        (["--algo.sample_filter", "dynamic_filtering"], "--algo.sample_filter 'dynamic_filtering': that sample filter is "
         "installed (plugin 'dapo', rlhf-plugin-dapo) but not in the --plugins allow-list"),
        (["--data.processor", "vlm"], "--data.processor 'vlm': that processor is installed (plugin 'vlm', rlhf-plugin-vlm)"),
        (["--train.model_loaders", "liger"], "--train.model_loaders 'liger': that model loader is installed (plugin "
         "'liger', rlhf-plugin-liger)"),
        (["--actor.optim", "adamw2"], "--actor.optim 'adamw2': no optimizer of that name is installed. Did you mean 'adam'?"),
        (["--data.chat_template_kwargs", "{enable_thinking: false}"], "--data.chat_template_kwargs: Value error, not JSON"),
        (["--data.chat_template_kwargs", "[1]"], "--data.chat_template_kwargs: Value error, must be a JSON object"),
    ],
)
def test_bad_flags_get_errors_that_name_them(host: PluginHost, argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(host, *argv)
    assert message in str(err.value)


def test_component_hint_names_the_first_party_package() -> None:
    """A registry that no installed plugin fills (here: a bare one) names the first-party package to install."""
    message = ComponentRegistry().unknown_message(K.ADVANTAGE_ESTIMATOR, "group_norm", flag="--algo.advantage.estimator")
    assert "It is provided by rlhf-plugin-grpo: pip install rlhf-plugin-grpo" in message


def test_unknown_yaml_key_names_the_file_and_suggests(host: PluginHost, tmp_path: Path) -> None:
    run = tmp_path / "run.yaml"
    run.write_text("actor:\n  adam:\n    lrr: 1.0e-6\n")
    with pytest.raises(ConfigError, match=rf"actor.adam.lrr in {run}: unknown option; did you mean actor.adam.lr\?"):
        parse(host, "--config", str(run))
    run.write_text("- a list\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        parse(host, "--config", str(run))


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--algo.advantage.estimator", "group_norm"], "needs --rollout.n_samples_per_prompt >= 2 (got 1)"),
        (["--vllm.enable_sleep"], "--vllm.enable_sleep only makes sense with --train.colocate_all"),
        (["--vllm.enable_sleep", "--train.colocate_all", "--train.async_enable"], "cannot be combined with --train.async_enable"),
        (["--train.partial_rollout_enable"], "requires --train.async_enable"),
        (["--eval.dataset", "x.jsonl"], "--eval.dataset needs a rule or remote reward"),
        (["--algo.dynamic_filtering_enable", "--reward.remote_url", "r.py"], "needs --rollout.n_samples_per_prompt >= 2"),
        (["--algo.dynamic_filtering_enable", "--rollout.n_samples_per_prompt", "4"], "filters on rule/remote scores"),
        (["--rollout.vllm_generate_batch_size", "2048"], "requires --train.async_enable"),
        (["--rollout.batch_size", "2", "--actor.num_gpus_per_node", "8"], "smaller than the actor's data-parallel size 8"),
        (["--data.max_images_per_prompt", "1"], "pip install rlhf-plugin-vlm"),
    ],
)
def test_cross_flag_rules(host: PluginHost, argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(host, *argv)
    assert message in str(err.value)


def test_post_parse_rewrites(host: PluginHost, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        cfg = parse(host, "--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "4",
                    "--algo.advantage.gamma", "0.9", "--train.agent_func_path", "agent.py")
    assert cfg.algo.advantage.gamma == 1.0 and "uses gamma = 1" in caplog.text
    assert cfg.train.agent_executor == "multi_turn" and cfg.reward.remote_url is None  # the agent gives the rewards
    assert parse(host).train.agent_executor == "single_turn"
    assert cfg.rollout.vllm_generate_batch_size == cfg.rollout.batch_size
    assert cfg.critic.model_name_or_path is None  # no critic for group_norm
    gae = parse(host, "--actor.model_name_or_path", "a", "--reward.model_name_or_path", "rm1,rm2")
    assert gae.critic.model_name_or_path == "rm1"
    remote = parse(host, "--actor.model_name_or_path", "a", "--reward.remote_url", "http://x")
    assert remote.critic.model_name_or_path == "a"


class EchoOptions(BaseModel):
    model_config = {"extra": "forbid"}
    scale: float = Field(0.01, description="reward per character")
    prefix: str = Field("", description="only count responses starting with this")


def options_plugin(name: str, namespace: str | None = None) -> types.SimpleNamespace:
    def rlhf_register_options(register):
        register(EchoOptions, namespace=namespace)

    return types.SimpleNamespace(rlhf_plugin_api=rlhf.PLUGIN_API_VERSION,
                                 rlhf_register_options=rlhf.hookimpl(rlhf_register_options))


def test_plugin_options_from_flags_and_yaml(host: PluginHost, register_plugin, plugin_host: PluginHost,
                                            tmp_path: Path) -> None:
    for name in ("ppo", "adamw", "kl", "deepspeed", "weighted_rewards"):
        register_plugin(__import__(f"rlhf_plugin_{name}"), name=name.replace("_", "-"))
    register_plugin(options_plugin("echo"), name="echo")
    run = tmp_path / "run.yaml"
    run.write_text("plugins:\n  echo:\n    prefix: answer\n")
    cfg = parse(plugin_host, "--config", str(run), "--echo.scale", "0.5")
    assert cfg.plugins == {"echo": {"scale": 0.5, "prefix": "answer"}}
    assert parse(plugin_host).plugins == {"echo": {"scale": 0.01, "prefix": ""}}
    with pytest.raises(ConfigError, match=r"--echo.scale: Input should be a valid number"):
        parse(plugin_host, "--echo.scale", "lots")
    run.write_text("plugins:\n  ecko:\n    prefix: answer\n")
    with pytest.raises(ConfigError, match=r"no loaded plugin declares options under 'ecko'. Did you mean 'echo'\?"):
        parse(plugin_host, "--config", str(run))
    help_text = ConfigParser(PPOConfig, plugin_host, prog="rlhf train ppo").parser.format_help()
    assert "--echo.*:\n  options of plugin echo" in help_text


def test_option_namespace_collisions_name_both_sides(plugin_host: PluginHost, register_plugin) -> None:
    register_plugin(options_plugin("first", namespace="shared"), name="first")
    with pytest.raises(PluginLoadError, match="claimed by both plugin 'first' and plugin 'second'"):
        register_plugin(options_plugin("second", namespace="shared"), name="second")
    assert [(r.name, r.status) for r in plugin_host.records if r.source == "module"] == [("first", "ok"), ("second", "failed")]
    register_plugin(options_plugin("sneaky", namespace="actor"), name="sneaky")
    with pytest.raises(ConfigError, match="plugin 'sneaky' declares option namespace 'actor', which is a core config section"):
        ConfigParser(PPOConfig, plugin_host, prog="rlhf train ppo")


def test_help_groups_flags_by_namespace(host: PluginHost) -> None:
    help_text = ConfigParser(PPOConfig, host, prog="rlhf train ppo").parser.format_help()
    for section in ("--actor.*", "--actor.adam.*", "--critic.*", "--algo.advantage.*", "--ds.lora.*", "--logger.wandb.*"):
        assert f"\n{section}:" in help_text, section
    assert "--algo.advantage.estimator NAME" in help_text and "installed: gae, group_norm" in help_text


@pytest.fixture(scope="module")
def zoo() -> PluginHost:
    return PluginHost.load()


def test_preset_expands_below_yaml_and_flags(zoo: PluginHost, tmp_path: Path) -> None:
    cfg = parse(zoo, "--algo.preset", "dapo", "--reward.remote_url", "r.py")
    assert cfg.algo.advantage.estimator == "group_norm" and cfg.rollout.n_samples_per_prompt == 8
    assert cfg.algo.kl.use_loss and cfg.algo.kl.estimator == "k3" and cfg.algo.kl.init_coef == 1e-3
    assert cfg.actor.eps_clip_low_high == [0.2, 0.27] and cfg.algo.dynamic_filtering_enable
    run = tmp_path / "run.yaml"
    run.write_text("algo:\n  preset: dapo\n  kl:\n    init_coef: 0.002\n")
    cfg = parse(zoo, "--config", str(run), "--rollout.n_samples_per_prompt", "4", "--reward.remote_url", "r.py")
    assert cfg.algo.kl.init_coef == 0.002 and cfg.rollout.n_samples_per_prompt == 4 and cfg.algo.kl.estimator == "k3"
    with pytest.raises(ConfigError, match=r"--algo.preset 'dappo': no preset of that name is installed. Did you mean 'dapo'\?"):
        parse(zoo, "--algo.preset", "dappo")


@pytest.mark.parametrize(("argv", "message"), [
    (["--algo.advantage.is_correction_level", "seq", "--algo.advantage.is_correction_mode", "clip"],
     "clip needs --algo.advantage.is_correction_level token"),
    (["--algo.advantage.is_correction_level", "token", "--algo.advantage.is_correction_gating", "tv"],
     "bounds a divergence: give one HIGH threshold or LOW 0 (got LOW 0.5)"),
])
def test_invalid_is_correction_flags(zoo: PluginHost, argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse(zoo, *argv)
    assert message in str(err.value)


def test_every_openrlhf_estimator_and_loss_is_installed(zoo: PluginHost) -> None:
    from rlhf.registry import ComponentKind

    assert set(zoo.registry.names(ComponentKind.ADVANTAGE_ESTIMATOR)) == {
        "gae", "reinforce", "reinforce_baseline", "rloo", "group_norm", "dr_grpo", "flash_reinforce"}
    assert set(zoo.registry.names(ComponentKind.POLICY_LOSS)) == {"ppo", "gspo"}
    for name in ("reinforce_baseline", "rloo", "group_norm", "dr_grpo"):
        with pytest.raises(ConfigError, match=f"{name} compares samples of the same prompt"):
            parse(zoo, "--algo.advantage.estimator", name)


ALGORITHM_PLUGINS = {
    "grpo": (K.ADVANTAGE_ESTIMATOR, "group_norm", "--algo.advantage.estimator"),
    "reinforce": (K.ADVANTAGE_ESTIMATOR, "reinforce", "--algo.advantage.estimator"),
    "rloo": (K.ADVANTAGE_ESTIMATOR, "rloo", "--algo.advantage.estimator"),
    "dr-grpo": (K.ADVANTAGE_ESTIMATOR, "dr_grpo", "--algo.advantage.estimator"),
    "flash-reinforce": (K.ADVANTAGE_ESTIMATOR, "flash_reinforce", "--algo.advantage.estimator"),
    "gspo": (K.POLICY_LOSS, "gspo", "--actor.policy_loss_type"),
    "dapo": (K.PRESET, "dapo", "--algo.preset"),
}


@pytest.mark.parametrize("plugin", list(ALGORITHM_PLUGINS))
def test_blocking_one_algorithm_plugin_removes_only_its_names(plugin: str) -> None:
    kind, name, flag = ALGORITHM_PLUGINS[plugin]
    without = PluginHost.load(PluginSelection.parse(f"no:{plugin}"))
    assert name not in without.registry.names(kind)
    with pytest.raises(ConfigError, match=rf"{flag} '{name}': that {kind.label} is installed \(plugin '{plugin}', "
                                          rf"rlhf-plugin-{plugin}\) but blocked by --plugins no:{plugin}; remove no:{plugin}"):
        parse(without, flag, name, "--rollout.n_samples_per_prompt", "4", "--reward.remote_url", "r.py")
    assert parse(without).algo.advantage.estimator == "gae"  # everything else still works


def test_adaptive_kl_controller() -> None:
    from rlhf.runtime.control.controller import KLController

    fixed = KLController(0.01, None, 10000)
    fixed.update(5.0, 1024)
    assert fixed.value == 0.01
    adaptive = KLController(0.1, 0.5, 1000)
    adaptive.update(0.6, 100)  # error = clip(0.6/0.5 - 1, ±0.2) = 0.2
    assert adaptive.value == pytest.approx(0.1 * (1 + 0.2 * 100 / 1000))
    adaptive.update(0.0, 100)  # error = -1 clipped to -0.2
    assert adaptive.value == pytest.approx(0.1 * 1.02 * (1 - 0.02))


def test_async_and_agent_flags_are_implemented(host: PluginHost, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        cfg = parse(host, "--train.async_enable", "--train.partial_rollout_enable", "--train.async_queue_size", "2",
                    "--train.agent_func_path", "env.py", "--train.agent_executor", "openai_server")
    assert "not implemented" not in caplog.text
    assert cfg.train.agent_executor == "openai_server"  # an explicit executor wins over the agent file's default


def test_a_sample_filter_is_chosen_by_name(tmp_path: Path) -> None:
    """--algo.sample_filter builds the named filter, with the flag named when the name is wrong at build time."""
    from rlhf.runtime.control.controller import PPOController

    reward = tmp_path / "reward.py"
    reward.write_text("def reward_func(queries, prompts, labels, **kwargs):\n    return [0.0] * len(queries)\n")
    host = PluginHost.load(PluginSelection.parse("ppo,grpo,adamw,kl,dapo,single-turn,reward-func,deepspeed,weighted-rewards", strict=True))
    config = parse(host, "--algo.sample_filter", "dynamic_filtering", "--rollout.n_samples_per_prompt", "4",
                   "--algo.advantage.estimator", "group_norm", "--reward.remote_url", str(reward))
    controller = PPOController(config, host, tmp_path / "out")
    assert type(controller.sample_filter).__name__ == "DynamicFilter"
    assert PPOController(parse(host, "--reward.remote_url", str(reward)), host, tmp_path / "out").sample_filter is None


def test_chat_template_variables_are_a_json_object_on_the_command_line_and_a_mapping_in_yaml(host, tmp_path) -> None:
    flagged = parse(host, "--data.chat_template_kwargs", '{"enable_thinking": false, "reasoning_effort": "low"}')
    assert flagged.data.chat_template_kwargs == {"enable_thinking": False, "reasoning_effort": "low"}
    (tmp_path / "run.yaml").write_text("data:\n  chat_template_kwargs:\n    enable_thinking: false\n")
    assert parse(host, "--config", str(tmp_path / "run.yaml")).data.chat_template_kwargs == {"enable_thinking": False}
    assert parse(host).data.chat_template_kwargs is None
