"""Discovery, selection and failure isolation, with fixture plugins installed for real by pip."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from rlhf_test_support import PRIVATE, RlhfCli, pip_install_target

import rlhf
from rlhf.errors import ConfigError
from rlhf.host.plugin_host import PluginHost, PluginLoadError
from rlhf.host.selection import PluginSelection
from rlhf.registry import ComponentKind
from rlhf.testing.cli import assert_user_error


def test_first_party_plugins_are_listed_with_kind_version_and_components(rlhf_cli: RlhfCli) -> None:
    records = rlhf_cli.plugins()
    assert records["ppo"]["status"] == "ok"
    assert records["ppo"]["kind"] == "algorithms"
    assert records["ppo"]["distribution"] == "rlhf-plugin-ppo"
    assert records["ppo"]["version"] == "0.1.0"
    assert records["ppo"]["components"] == {"advantage_estimator": ["gae"], "policy_loss": ["ppo"]}
    assert records["grpo"]["components"] == {"advantage_estimator": ["group_norm"]}
    assert records["adamw"]["kind"] == "optimizers"
    assert records["core"]["components"] == {"trainer": ["ppo"], "rollout_scheduler": ["sync", "replay"]}


def test_pip_installed_plugin_appears_without_another_step(tmp_path: Path) -> None:
    before = RlhfCli(tmp_path).plugins()
    assert "echo" not in before
    pip_install_target(tmp_path, "rlhf-plugin-echo")
    record = RlhfCli(tmp_path).plugins()["echo"]
    assert record["status"] == "ok"
    assert record["distribution"] == "rlhf-plugin-echo" and record["version"] == "0.3.1"
    assert record["components"] == {"reward_function": ["echo_length"]}
    assert record["options"] == ["echo"]
    assert record["hooks"] == ["rlhf_register_options", "rlhf_register_reward_functions"]


def test_broken_plugins_are_listed_as_failed_with_reasons(rlhf_cli: RlhfCli) -> None:
    result = rlhf_cli("plugins", "--json")
    import json

    records = {r["name"]: r for r in json.loads(result.stdout)}
    broken = records["broken"]
    assert broken["status"] == "failed"
    assert "No module named 'rlhf_dependency_that_is_not_installed'" in broken["reason"]
    assert "trainer_state" in records["badsig"]["reason"]
    assert "unknown hook(s): rlhf_register_advantage_estimator (did you mean rlhf_register_advantage_estimators?)" in (
        records["typo"]["reason"]
    )
    future = records["future"]  # needs a plugin API newer than this core serves
    assert future["status"] == "incompatible"
    assert "needs plugin API 99" in future["reason"] and "pip install -U 'rlhf-core>=0.99'" in future["reason"]
    legacy = records["legacy"]  # its component module imports a removed name: refused, though only a cap excludes it
    assert legacy["status"] == "incompatible" and legacy["version"] == "0.9.0"
    api = rlhf.PLUGIN_API_VERSION
    assert legacy["reason"] == ("executor.py line 4 imports rlhf.engines.hf_models, removed in plugin API 2; use "
                                "rlhf.models.loading: pip install -U rlhf-plugin-legacy "
                                f"(a release built for plugin API {api}), or change that import")
    shadow = records["echo_shadow"]
    assert shadow["status"] == "failed"
    assert "registered by both plugin 'echo' and plugin 'echo_shadow'" in shadow["reason"]
    assert shadow["components"] == {}  # rolled back entirely
    assert records["echo"]["status"] == "ok"
    # one warning per failed plugin, each naming it
    warnings = [line for line in result.stderr.splitlines() if "failed to load" in line or "is incompatible" in line]
    assert sorted(w.split("'")[1] for w in warnings) == ["badsig", "broken", "echo_shadow", "future", "legacy", "typo"]


def test_a_run_selecting_an_incompatible_plugin_fails_with_one_line(rlhf_cli: RlhfCli) -> None:
    result = rlhf_cli("train", "ppo", "--plugins", "ppo,legacy", "--actor.model_name_or_path", "m", check=False)
    assert_user_error(result, "plugin 'legacy'", "is incompatible", "rlhf.engines.hf_models", "removed in plugin API 2",
                      "rlhf.models.loading")
    shown = rlhf_cli("plugins").stdout
    assert "incompatible" in shown and "legacy" in shown


def test_every_command_still_works_next_to_a_broken_plugin(rlhf_cli: RlhfCli) -> None:
    assert "plugin selection" in rlhf_cli("--help").stdout
    assert "ppo" in rlhf_cli("train").stdout
    out = rlhf_cli("train", "ppo", "--print-config", "--rollout.n_samples_per_prompt", "4").stdout
    assert "n_samples_per_prompt: 4" in out
    assert "rlhf plugins" in rlhf_cli("plugins").stdout


def test_no_prefix_blocks_a_plugin_and_its_components(rlhf_cli: RlhfCli) -> None:
    records = rlhf_cli.plugins("--plugins", "no:echo")
    assert records["echo"]["status"] == "blocked"
    assert records["echo_shadow"]["status"] == "ok"  # its name no longer collides
    assert records["ppo"]["status"] == "ok"
    blocked_grpo = rlhf_cli("train", "ppo", "--plugins", "no:grpo", "--algo.advantage.estimator", "group_norm", check=False)
    assert blocked_grpo.returncode == 2
    assert ("'group_norm': that advantage estimator is installed (plugin 'grpo', rlhf-plugin-grpo) but blocked by "
            "--plugins no:grpo" in blocked_grpo.stderr)


@pytest.mark.parametrize(
    ("spec", "names"),
    [
        ("no:ech", ["--plugins no:ech", "no installed plugin is called 'ech'", "did you mean no:echo?"]),
        ("no:group_norm", ["'group_norm'", "a component of plugin 'grpo'", "no:grpo"]),
        ("ppo,no:core", ["no:core", "built into rlhf and cannot be blocked"]),
    ],
)
def test_blocking_a_name_that_is_no_installed_plugin_is_an_error(rlhf_cli: RlhfCli, spec: str, names: list[str]) -> None:
    from rlhf.testing.cli import assert_user_error

    assert_user_error(rlhf_cli("plugins", "--plugins", spec, check=False), *names)
    assert_user_error(rlhf_cli("train", "ppo", "--print-config", env={"RLHF_PLUGINS": spec}, check=False),
                      "RLHF_PLUGINS", *names[1:])


def test_names_switch_to_an_allow_list_by_entry_point_or_distribution_name(rlhf_cli: RlhfCli) -> None:
    records = rlhf_cli.plugins("--plugins", "ppo,rlhf-plugin-adamw")
    assert {n for n, r in records.items() if r["status"] == "ok"} == {"core", "ppo", "adamw"}
    assert records["grpo"]["status"] == "blocked" and "allow-list" in records["grpo"]["reason"]
    assert records["broken"]["status"] == "blocked"  # never imported


def test_environment_variable_has_the_same_semantics_and_the_flag_wins(rlhf_cli: RlhfCli) -> None:
    env = {"RLHF_PLUGINS": "no:echo,no:broken"}
    records = rlhf_cli.plugins(env=env)
    assert records["echo"]["status"] == "blocked" and records["broken"]["status"] == "blocked"
    assert "RLHF_PLUGINS" in records["echo"]["reason"]
    records = rlhf_cli.plugins("--plugins", "grpo", env=env)
    assert {n for n, r in records.items() if r["status"] == "ok"} == {"core", "grpo"}
    assert {n for n, r in rlhf_cli.plugins(env={"RLHF_PLUGINS": ""}).items() if r["status"] == "ok"} == {"core"}


def test_private_module_and_file_plugins_load_without_packaging(rlhf_cli: RlhfCli) -> None:
    records = rlhf_cli.plugins("--plugins", "private_plugins.corp_rewards,./my_reward.py", cwd=PRIVATE)
    module = records["private_plugins.corp_rewards"]
    assert module["source"] == "module" and module["components"] == {"reward_function": ["corp_policy"]}
    assert records["ppo"]["status"] == "ok"  # modules and files add to autoload
    file = records["my_reward"]
    assert file["source"] == "file" and file["status"] == "ok"
    assert file["target"] == str(PRIVATE / "my_reward.py")
    assert len(file["sha256"]) == 64


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("broken", "plugin 'broken' (entry-point rlhf_plugin_broken) failed to load: import failed"),
        ("./does_not_exist.py", "does not exist"),
        ("nosuch", "'nosuch' is neither an installed plugin nor an importable module"),
        ("ppo,futur", "Did you mean 'future'?"),
    ],
)
def test_a_failing_plugin_named_explicitly_is_an_error(rlhf_cli: RlhfCli, spec: str, message: str) -> None:
    result = rlhf_cli("plugins", "--plugins", spec, check=False)
    assert result.returncode == 2
    assert message in result.stderr


def test_strict_mode_turns_any_failure_into_an_error(rlhf_cli: RlhfCli) -> None:
    for args, env in ((("--strict-plugins",), {}), ((), {"RLHF_STRICT_PLUGINS": "1"})):
        result = rlhf_cli("plugins", *args, env=env, check=False)
        # the first plugin loaded (group rlhf.agents) is legacy: strict mode keeps refusing an upper cap that
        # excludes this core (without it, an old plugin that passes its checks loads with a warning)
        assert_user_error(result, "plugin 'legacy'", "rlhf-core<0.2,>=0.1", "--strict-plugins refuses an upper cap")
    assert rlhf_cli("plugins", "--strict-plugins", "--plugins", "ppo,grpo", check=False).returncode == 0


def test_kind_filter(rlhf_cli: RlhfCli) -> None:
    records = rlhf_cli.plugins("--kind", "optimizers")
    assert set(records) == {"adamw", "muon"}
    models = rlhf_cli.plugins("--kind", "models")
    assert {"liger", "ring-attn", "vlm"} <= set(models) and all(r["kind"] == "models" for r in models.values())


def test_kind_filter_takes_component_kinds_and_refuses_a_name(rlhf_cli: RlhfCli) -> None:
    """--kind matches what a plugin registers, spelled as a component kind (singular or plural, - or _); a name
    that is no kind is one error line, never an empty table."""
    from rlhf.cli.plugins_cmd import matches_kind

    host = PluginHost.load()  # the first-party plugins of this environment, in this process

    def listed(kind: str) -> set[str]:
        return {record.name for record in host.records if matches_kind(record, kind, host)}

    for spelling in ("rollout_engine", "rollout-engine", "rollout_engines", "Rollout-Engines"):
        assert listed(spelling) == {"hf-generate", "vllm"}, spelling
    assert "reward-func" in listed("reward-function") and "reward-func" not in listed("policy-loss")
    assert listed("backend") == listed("backends") >= {"vllm", "deepspeed", "core"}  # core registers `sync`
    assert_user_error(rlhf_cli("plugins", "--kind", "hf", check=False), "--kind hf", "rollout engine",
                      "rlhf plugins --kind rollout-engine")
    with pytest.raises(ConfigError, match="--kind engines: not a kind; .*backends.*rollout-engine"):
        listed("engines")


def test_a_component_of_a_blocked_plugin_is_named_installed_and_blocked(rlhf_cli: RlhfCli, tmp_path: Path) -> None:
    """A third-party plugin's component, asked for while --plugins keeps the plugin out: the line says it is installed,
    by which plugin and distribution, and what to change in --plugins (not "no ... of that name is installed")."""
    reward = tmp_path / "r.py"
    reward.write_text("def reward_func(queries, prompts, labels, **kwargs):\n    return [0.0] * len(queries)\n")
    run = ["train", "ppo", "--actor.model_name_or_path", "m", "--reward.functions", "echo_length"]
    line = assert_user_error(rlhf_cli("--plugins", "no:echo,no:echo_shadow", *run, check=False),
                             "--reward.functions 'echo_length': that reward function is installed (plugin 'echo', "
                             "rlhf-plugin-echo) but blocked by --plugins no:echo; remove no:echo from --plugins")
    assert "no reward function of that name is installed" not in line
    assert_user_error(rlhf_cli("--plugins", "ppo,weighted-rewards", *run, check=False),  # an allow-list without a backend
                      "--train.backend 'deepspeed': that training backend is installed (plugin 'deepspeed', "
                      "rlhf-plugin-deepspeed) but not in the --plugins allow-list; add deepspeed to --plugins")
    assert_user_error(rlhf_cli("--plugins", "no:vllm", "train", "ppo", "--actor.model_name_or_path", "m",
                               "--reward.remote_url", str(reward), "--rollout.engine", "vllm", check=False),
                      "--rollout.engine 'vllm': that rollout engine is installed (plugin 'vllm', rlhf-plugin-vllm) but "
                      "blocked by --plugins no:vllm")


@pytest.mark.parametrize(("flag", "plugin"), [(["--ds.use_liger_kernel"], "liger"), (["--ds.ring_attn_size", "2"], "ring-attn"),
                                              (["--data.image_key", "images"], "vlm")])
def test_a_flag_of_a_blocked_model_plugin_says_what_to_install(rlhf_cli: RlhfCli, flag: list[str], plugin: str) -> None:
    result = rlhf_cli("train", "ppo", "--plugins", f"no:{plugin}", "--actor.model_name_or_path", "m", *flag, check=False)
    assert result.returncode == 2
    assert f"is implemented by the {plugin!r} plugin, which is not loaded: pip install rlhf-plugin-{plugin}" in result.stderr


def test_resolved_set_reloads_exactly_and_detects_a_changed_file(third_party_site: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(third_party_site))
    monkeypatch.syspath_prepend(str(PRIVATE))
    plugin_file = tmp_path / "my_reward.py"
    shutil.copy(PRIVATE / "my_reward.py", plugin_file)
    host = PluginHost.load(PluginSelection.parse(f"ppo,echo,private_plugins.corp_rewards,{plugin_file}"))
    resolved = host.resolved()
    assert [r["name"] for r in resolved] == ["core", "ppo", "echo", "private_plugins.corp_rewards", "my_reward"]

    again = PluginHost.load(PluginSelection.from_resolved(resolved))
    assert again.resolved() == resolved
    assert again.registry.names(ComponentKind.REWARD_FUNCTION) == ["echo_length", "corp_policy", "file_reward"]

    plugin_file.write_text(plugin_file.read_text() + "\n# edited\n")
    with pytest.raises(PluginLoadError, match="changed since the run started"):
        PluginHost.load(PluginSelection.from_resolved(resolved))
    tampered = [dict(r, version="9.9.9") if r["name"] == "echo" else r for r in resolved]
    with pytest.raises(PluginLoadError, match=r"install rlhf-plugin-echo==9.9.9"):
        PluginHost.load(PluginSelection.from_resolved(tampered[:-1]))
