"""A user's install: every first-party wheel served by a real package index (pypiserver on 127.0.0.1), a fresh venv,
``pip install rlhf-plugin-grpo`` (not editable), then the ``rlhf`` meta-distribution; the plugin is listed with its
version, trains 2 steps, and once uninstalled a run asking for it names the package to install.

The venv takes torch, Ray, vLLM, DeepSpeed and the rest from this test environment (a folder of links to its
site-packages without any rlhf distribution) instead of downloading gigabytes again; pip sees them as installed,
and anything the wheels require beyond them must come from the local index, so a missing requirement fails here."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from rlhf_test_support import FIXTURES, base_flags, venv_sharing_this_environment

from rlhf.distributed import free_port
from rlhf.testing.cli import assert_user_error

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def index_url(first_party_wheels: Path, tmp_path_factory: pytest.TempPathFactory):
    port = free_port()
    log = (tmp_path_factory.mktemp("index") / "pypiserver.log").open("w")
    server = subprocess.Popen([sys.executable, "-m", "pypiserver", "run", "-i", "127.0.0.1", "-p", str(port),
                               "--disable-fallback", str(first_party_wheels)], stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}/simple/"
    deadline = time.monotonic() + 60
    while True:
        try:
            urllib.request.urlopen(url, timeout=2).close()
            break
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                pytest.fail(f"pypiserver did not answer at {url}")
            time.sleep(0.3)
    yield url
    server.terminate()
    server.wait(timeout=30)
    log.close()


@pytest.fixture(scope="module")
def user_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return venv_sharing_this_environment(tmp_path_factory.mktemp("user"))


def in_venv(venv: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLHF_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}")
    return subprocess.run([str(venv / "bin" / args[0]), *args[1:]], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=venv.parent)


def pip_install(venv: Path, index_url: str, *requirements: str) -> None:
    done = in_venv(venv, "python", "-m", "pip", "install", "--quiet", "--index-url", index_url, *requirements)
    assert done.returncode == 0, done.stderr[-3000:]


def listed(venv: Path) -> dict[str, dict]:
    done = in_venv(venv, "rlhf", "plugins", "--json")
    assert done.returncode == 0, done.stderr[-3000:]
    return {record["name"]: record for record in json.loads(done.stdout)}


def test_a_plugin_installs_from_an_index_trains_and_uninstalls(user_venv: Path, index_url: str, tiny_causal_lm_path: Path,
                                                                task_files: dict[str, Path], tmp_path: Path) -> None:
    pip_install(user_venv, index_url, "rlhf-plugin-grpo")
    grpo = listed(user_venv)["grpo"]
    assert (grpo["status"], grpo["distribution"], grpo["version"]) == ("ok", "rlhf-plugin-grpo", "0.1.0")
    assert grpo["components"] == {"advantage_estimator": ["group_norm"]}
    where = in_venv(user_venv, "python", "-c", "import rlhf_plugin_grpo; print(rlhf_plugin_grpo.__file__)").stdout
    assert str(user_venv) in where  # installed into the venv from the index, not linked to the checkout

    pip_install(user_venv, index_url, "rlhf")
    run = tmp_path / "run"
    flags = [*base_flags(tiny_causal_lm_path, task_files["prompts"], run, "hf", steps=2), "--reward.remote_url",
             str(task_files["reward"]), "--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "2",
             "--train.batch_size", "8", "--algo.kl.init_coef", "0"]
    trained = in_venv(user_venv, "rlhf", "train", "ppo", *flags)
    assert trained.returncode == 0, trained.stderr[-4000:]
    steps = [json.loads(line)["step"] for line in (run / "out" / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]

    removed = in_venv(user_venv, "python", "-m", "pip", "uninstall", "--yes", "rlhf-plugin-grpo")
    assert removed.returncode == 0, removed.stderr
    assert "grpo" not in listed(user_venv)
    refused = in_venv(user_venv, "rlhf", "train", "ppo", *flags)
    assert_user_error(refused, "--algo.advantage.estimator", "'group_norm'", "pip install rlhf-plugin-grpo")


def test_an_editable_plugin_importing_a_removed_name_is_shown_incompatible(user_venv: Path, index_url: str,
                                                                         tmp_path: Path) -> None:
    """Its files are read where an editable install points: one that imports a removed name is incompatible."""
    pip_install(user_venv, index_url, "rlhf-core")
    source = tmp_path / "rlhf-plugin-legacy"
    shutil.copytree(FIXTURES / "rlhf-plugin-legacy", source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    done = in_venv(user_venv, "python", "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                   "--editable", str(source))
    assert done.returncode == 0, done.stderr[-3000:]
    legacy = listed(user_venv)["legacy"]
    assert legacy["status"] == "incompatible" and "imports rlhf.engines.hf_models, removed in plugin API 2" in legacy["reason"]
