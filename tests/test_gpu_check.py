"""scripts/gpu_check.sh, the GPU check. Its GPU parts run on a lent GPU machine only; here its install step from a
wheelhouse runs for real, with the package index switched off, into a fresh venv that shares this environment's
packages (the GPU host's own torch and the rest) but no rlhf distribution, and every gpu-marked test is checked
to carry a time limit that fits the check's part."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rlhf_test_support import build_wheels, venv_sharing_this_environment

from rlhf.testing.cli import child_env

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"


def gpu_check(*args: str, python: Path | None = None, tmpdir: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in child_env().items() if not k.startswith(("RLHF_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1", **({"PYTHON": str(python)} if python else {}),
               **({"TMPDIR": str(tmpdir)} if tmpdir else {}))
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.slow
def test_the_install_step_installs_from_a_wheelhouse_without_an_index(tmp_path: Path, source_tree_lock) -> None:
    wheelhouse = tmp_path / "wheelhouse"
    with source_tree_lock:
        build_wheels(wheelhouse, [ROOT / "core", ROOT / "plugins" / "algorithms" / "grpo"])
    (wheelhouse / "torch-2.99.0-cp311-cp311-linux_x86_64.whl").write_text("not a wheel")  # the host's torch stays
    venv = venv_sharing_this_environment(tmp_path)
    site, results = tmp_path / "site", tmp_path / "out" / "results.txt"

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    done = gpu_check("--wheelhouse", str(wheelhouse), "--install-only", "--site", str(site), "--results", str(results),
                     python=venv / "bin" / "python", tmpdir=scratch)

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    text = results.read_text()
    assert "skipped torch-2.99.0" in text and "installed 2 files" in text, text
    assert re.search(rf"rlhf \d+\.\d+\.\d+ from {re.escape(str(site))}/rlhf/__init__.py", text), text
    assert not list(scratch.glob("rlhf-gpu-check.*")), "the check left its scratch folder behind"
    env = {**child_env(), "PYTHONPATH": str(site), "PIP_NO_INDEX": "1"}
    listed = subprocess.run([str(site / "bin" / "rlhf"), "plugins", "--json"], capture_output=True, text=True, env=env,
                            timeout=120)  # the console script the install wrote, on the venv's interpreter
    assert listed.returncode == 0, listed.stderr[-3000:]
    grpo = {record["name"]: record for record in json.loads(listed.stdout)}["grpo"]
    assert (grpo["status"], grpo["distribution"]) == ("ok", "rlhf-plugin-grpo")
    imported = subprocess.run([str(venv / "bin" / "python"), "-c", "import rlhf_plugin_grpo; print(rlhf_plugin_grpo.__file__)"],
                              capture_output=True, text=True, env=env, timeout=120)
    assert imported.stdout.startswith(str(site)), imported.stdout + imported.stderr


def write_wheel(folder: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    """A minimal valid pure-Python wheel: one module and its dist-info."""
    import zipfile

    dist_info = f"{name}-{version}.dist-info"
    files = {f"{name}/__init__.py": "",
             f"{dist_info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                      + "".join(f"Requires-Dist: {r}\n" for r in requires),
             f"{dist_info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{dist_info}/RECORD"] = "".join(f"{path},,\n" for path in [*files, f"{dist_info}/RECORD"])
    with zipfile.ZipFile(folder / f"{name}-{version}-py3-none-any.whl", "w") as wheel:
        for path, text in files.items():
            wheel.writestr(path, text)


def test_an_unmet_requirement_of_any_brought_library_is_named_and_no_scratch_is_left(tmp_path: Path) -> None:
    """A library in the wheelhouse that needs what neither the folder nor the host has (fastapi 0.165 and
    opentelemetry-api) is named by the install step, not only rlhf's own; the check's scratch folder goes with it."""
    wheelhouse, scratch = tmp_path / "wheelhouse", tmp_path / "tmp"
    wheelhouse.mkdir(), scratch.mkdir()
    write_wheel(wheelhouse, "rlhf_core", "0.0.1")
    write_wheel(wheelhouse, "web_lib", "1.0", ("telemetry-lib-not-here>=1.4",))
    results = tmp_path / "results.txt"
    gpu_check("--wheelhouse", str(wheelhouse), "--install-only", "--site", str(tmp_path / "site"), "--results",
              str(results), python=Path(sys.executable), tmpdir=scratch)
    text = results.read_text()
    assert "installed 2 files" in text, text
    assert re.search(r"web.lib 1\.0 requires telemetry-lib-not-here", text, re.IGNORECASE), text
    assert list(scratch.iterdir()) == []


def test_the_wheelhouse_brings_what_fastapi_imports_at_start_up() -> None:
    """fastapi 0.165 imports opentelemetry (its telemetry middleware) and annotated_doc; the H100 image had neither,
    so the reward server and the OpenAI agent server could not start from a wheelhouse."""
    from packaging.requirements import Requirement

    lines = (line.split("#")[0].strip() for line in (ROOT / "scripts" / "gpu_wheelhouse.txt").read_text().splitlines())
    listed = {Requirement(line).name for line in lines if line}
    assert {"fastapi", "uvicorn", "starlette", "opentelemetry-api", "annotated-doc"} <= listed


def test_a_folder_without_rlhf_wheels_is_one_error_line(tmp_path: Path) -> None:
    done = gpu_check("--wheelhouse", str(tmp_path), "--install-only", "--results", str(tmp_path / "r.txt"))
    assert done.returncode == 2
    assert done.stderr.splitlines() == [f"gpu_check: error: --wheelhouse {tmp_path}: no rlhf_core wheel in it; build it "
                                        f"with bash scripts/make_wheelhouse.sh {tmp_path}"]


def test_a_site_folder_it_did_not_make_is_left_alone(tmp_path: Path) -> None:
    wheelhouse, site = tmp_path / "wheelhouse", tmp_path / "mine"
    wheelhouse.mkdir()
    (wheelhouse / "rlhf_core-0.3.0-py3-none-any.whl").write_text("")
    site.mkdir()
    (site / "precious.txt").write_text("keep")
    done = gpu_check("--wheelhouse", str(wheelhouse), "--site", str(site), "--install-only")
    assert done.returncode == 2 and "--site" in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr
    assert (site / "precious.txt").read_text() == "keep"


@pytest.mark.parametrize("script", ["gpu_check.sh", "make_wheelhouse.sh", "check_floors.sh"])
def test_the_scripts_parse_and_refuse_an_unknown_option(script: str) -> None:
    path = ROOT / "scripts" / script
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    done = subprocess.run(["bash", str(path), "--frobnicate"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("error:") == 1 and "--frobnicate" in done.stderr, done.stderr


def test_the_gpu_check_names_every_part() -> None:
    text = SCRIPT.read_text()
    for part in ("install", "environment", "GRPO step side by side", "gpu tests", "ZeRO-3 step",
                 "FSDP2 step", "vLLM rollout vs raw vLLM", "weight-sync transports", "Liger on", "flash-attn packing",
                 "deepcompile"):
        assert f'part "{part}"' in text, part
    assert "benchmarks/grpo_step.py --device cuda" in text


def _limit(name: str) -> int:
    return int(re.search(rf'part "{name}" (\d+) ', SCRIPT.read_text())[1])


def test_the_default_parts_fit_eight_minutes() -> None:
    """From a wheelhouse, in order: install, environment, the side by side; then the tests beside the two short runs."""
    lanes = max(_limit("gpu tests"), _limit("ZeRO-3 step") + _limit("FSDP2 step"))
    assert _limit("install") + _limit("environment") + _limit("GRPO step side by side") + lanes <= 8 * 60


def test_every_gpu_test_has_a_time_limit_within_its_part(tmp_path: Path) -> None:
    """Collected as the check collects them (the files that mark a test gpu): each gpu-marked test names its own
    pytest-timeout limit, within the "gpu tests" part's."""
    files = sorted(str(p) for d in ("tests", "core/tests", "plugins") for p in (ROOT / d).rglob("test_*.py")
                   if "mark.gpu" in p.read_text())
    report = tmp_path / "limits.json"
    (tmp_path / "limits_plugin.py").write_text(
        "import json, os\n"
        "def pytest_collection_modifyitems(items):\n"
        "    limits = {i.nodeid: (m.args[0] if (m := i.get_closest_marker('timeout')) else None)\n"
        "              for i in items if i.get_closest_marker('gpu')}\n"
        "    open(os.environ['LIMITS_REPORT'], 'w').write(json.dumps(limits))\n")
    env = {**child_env(), "LIMITS_REPORT": str(report),
           "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "limits_plugin", "-p",
                           "no:cacheprovider", "-n", "0", *files], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    limits = json.loads(report.read_text())
    assert limits, "no gpu-marked test was collected"
    part = _limit("gpu tests")
    assert {test: limit for test, limit in limits.items() if limit is None or limit > part - 10} == {}
