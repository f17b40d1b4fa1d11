"""Helpers shared by the cross-package tests: fixture plugin packages and a real `rlhf` subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from rlhf.testing.cli import child_env

ROOT = Path(__file__).resolve().parent.parent
FIRST_PARTY_DIRS = [ROOT / "core", *sorted(p for p in (ROOT / "plugins").glob("*/*") if (p / "pyproject.toml").is_file()),
                    ROOT]
FIXTURES = Path(__file__).parent / "fixture_plugins"
PRIVATE = FIXTURES / "private"
PACKAGES = ("rlhf-plugin-echo", "rlhf-plugin-echo-shadow", "rlhf-plugin-broken", "rlhf-plugin-badsig",
            "rlhf-plugin-typo", "rlhf-plugin-future", "rlhf-plugin-legacy")


def built_once(tmp_path_factory: pytest.TempPathFactory, name: str, build: Callable[[Path], None]) -> Path:
    """The folder ``name`` that ``build`` fills once per test session, however many xdist workers ask for it.

    ``--dist worksteal`` splits a module's tests between the workers, so a module- or session-scoped fixture would
    otherwise do its work once in each (a two-rank launch, a site build). The first worker to ask builds under a file
    lock; the others wait for it and get the same folder. A build that fails leaves no mark, and the next asker
    builds again from an empty folder (and fails the same way, in its own test)."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    shared = root.parent if "PYTEST_XDIST_WORKER" in os.environ else root  # the parent is this session's, not another's
    folder, complete = shared / name, shared / f"{name}.complete"
    with FileLock(str(shared / f"{name}.lock")):
        if not complete.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            complete.touch()
    return folder


def pip_install_target(target: Path, *packages: str) -> None:
    """Fixture packages installed into ``target`` as a user's pip would (no deps: rlhf-core is already installed).
    Each builds from its own copy: backends build in the source tree (``build/``, ``*.egg-info``), and two xdist
    workers building the same package at once would race on those folders."""
    sources = target.with_name(target.name + "-sources")
    for package in packages:
        shutil.copytree(FIXTURES / package, sources / package, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    install_built(target, [sources / p for p in packages])


def install_built(target: Path, sources: list[Path]) -> None:
    """``pip install --no-deps --target TARGET SOURCES…`` in two steps: the wheels built in one process
    (:func:`build_wheels`, next to ``target``), then pip installing those wheels, without its per-tree backend
    subprocesses."""
    wheels = target.with_name(target.name + "-wheels")
    build_wheels(wheels, sources)
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index", "--target", str(target),
                    *map(str, sorted(wheels.glob("*.whl")))],
                   check=True, timeout=300, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})


def build_wheels(directory: Path, sources: list[Path] = FIRST_PARTY_DIRS) -> None:
    """Wheels of ``sources`` (default: every first-party distribution and the meta-distribution) into ``directory``,
    built by their own backend in one process (tests/wheel_builder.py). Backends build in the source tree (``build/``,
    ``*.egg-info``): one build at a time."""
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("wheel_builder.py")), str(directory), *map(str, sources)],
                          capture_output=True, text=True, timeout=900)
    if done.returncode != 0:
        log = directory / "build.log"
        raise AssertionError(f"building wheels failed:\n{done.stderr[-3000:]}\n{log.read_text()[-3000:] if log.exists() else ''}")


def venv_sharing_this_environment(root: Path) -> Path:
    """A fresh venv at ``root/venv`` that sees this environment's packages (torch, Ray, vLLM, DeepSpeed...) through a
    folder of links to its site-packages, without any rlhf distribution: rlhf must be installed into it to be there.
    Its pip is this environment's (through the links), not the one ``ensurepip`` bundles with Python."""
    site = Path(sysconfig.get_paths()["purelib"])
    shared = root / "shared-site"
    shared.mkdir()
    for entry in site.iterdir():
        name = entry.name.lower()
        if name.startswith(("rlhf", "__editable__", "_rlhf")) or name.endswith(".pth") or name.endswith(".egg-link"):
            continue
        (shared / entry.name).symlink_to(entry)
    venv = root / "venv"
    # no pip of its own: ensurepip spends 4 CPU-s installing pip 23.2 (Python 3.11's bundled copy), which then
    # installs the wheels several times slower than this environment's
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    purelib = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    (Path(purelib) / "shared_test_env.pth").write_text(f"{shared}\n")
    return venv


class RlhfCli:
    """Runs the real ``rlhf`` command in a subprocess with chosen extra site dirs and env."""

    def __init__(self, *site_dirs: Path) -> None:
        self.site_dirs = [str(d) for d in site_dirs]

    def __call__(self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None,
                 check: bool = True) -> subprocess.CompletedProcess[str]:
        full_env = {k: v for k, v in child_env().items() if not k.startswith("RLHF_")}
        full_env["PYTHONPATH"] = os.pathsep.join([*self.site_dirs, str(PRIVATE)])
        full_env.update(env or {})
        # unless told, in a folder of its own: in the checkout, a run's default ./ckpt (its run log) would land there
        with tempfile.TemporaryDirectory(prefix="rlhf-cli-") as scratch:
            result = subprocess.run([sys.executable, "-m", "rlhf", *args], capture_output=True, text=True,
                                    env=full_env, cwd=cwd or scratch, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"rlhf {' '.join(args)} exited {result.returncode}:\n{result.stderr}")
        return result

    def plugins(self, *args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> dict[str, dict]:
        result = self("plugins", "--json", *args, env=env, cwd=cwd)
        return {record["name"]: record for record in json.loads(result.stdout)}


DIGIT_REWARD_FILE = '''
def reward_func(queries, prompts, labels, **kwargs):
    # a dense rule reward: share of digits in the response, plus a bonus for containing the label; each response's
    # digits as a column of its own (the sample table's, the rollout dump's)
    out, digits = [], []
    for query, prompt, label in zip(queries, prompts, labels):
        response = query[len(prompt):]
        digits.append("".join(ch for ch in response if ch.isdigit()))
        out.append(len(digits[-1]) / max(len(response), 1) + float(str(label) in response))
    return {"rewards": out, "scores": out, "extra_logs": {"digit_share": out}, "columns": {"digits": digits}}
'''


#: token-level IS correction that masks a token whose rollout/trainer probability ratio leaves [0.999, 1.001]: its
#: is_filter_ratio metric counts the tokens an engine's log-prob puts off the trainer's recompute
TIGHT_CORRECTION = ["--algo.advantage.is_correction_level", "token", "--algo.advantage.is_correction_threshold", "0.999",
                    "1.001"]


def grpo_flags(reward: Path) -> list[str]:
    """GRPO with a reward file: 4 samples per prompt, one optimizer step per rollout batch of base_flags', no KL."""
    return ["--reward.remote_url", str(reward), "--algo.advantage.estimator", "group_norm",
            "--rollout.n_samples_per_prompt", "4", "--train.batch_size", "16", "--algo.kl.init_coef", "0"]


def base_flags(model: Path, prompts: Path, run: Path, engine: str, steps: int) -> list[str]:
    return [
        "--actor.model_name_or_path", str(model), "--data.prompt_dataset", str(prompts), "--data.label_key", "label",
        "--data.apply_chat_template", "--data.max_len", "128", "--data.max_samples", str(4 * steps),
        "--rollout.batch_size", "4", "--rollout.max_new_tokens", "6", "--rollout.micro_batch_size", "8",
        "--train.micro_batch_size", "8", "--actor.adam.lr", "1e-3", "--ds.param_dtype", "fp32",
        "--actor.num_gpus_per_node", "1", "--critic.num_gpus_per_node", "1", "--ref.num_gpus_per_node", "1",
        "--reward.num_gpus_per_node", "1", "--vllm.num_engines", "1" if engine == "vllm" else "0",
        "--ckpt.output_dir", str(run / "out"), "--ckpt.path", str(run / "ckpt"),
        # beside an engine process the ranks would share the test's own process (a CPU cluster): keep each test's
        # DeepSpeed state (ZeRO-3's global HF config) out of the next one. tests/test_weight_sync.py and the
        # subprocess runs cover that layout.
        *(["--train.in_process", "off"] if engine == "vllm" else []),
    ]


def replay_of(flags: list[str], dump: Path) -> list[str]:
    """The flags of a run that trains again on ``dump`` (--rollout.replay_dir): the same, without the --eval.* ones (a
    replay has no engine to evaluate with)."""
    kept = [f for i, f in enumerate(flags) if not f.startswith("--eval.") and not flags[i - 1].startswith("--eval.")]
    return [*kept, "--rollout.replay_dir", str(dump)]


def assert_replayed(original: list[dict], replayed: list[dict]) -> None:
    """A replay logs every step's metrics as the dumped run did, to 1e-6: all but timings, evaluations and the
    checkpoint an evaluation made rlhf-plugin-best-checkpoint ask for."""
    assert [m["step"] for m in replayed] == [m["step"] for m in original]
    apart = ("timing/", "eval/", "steer/checkpoint")
    for before, after in zip(original, replayed):
        keys = {k for k in before if not k.startswith(apart)}
        assert keys == {k for k in after if not k.startswith(apart)}, (before["step"], keys ^ set(after))
        for key in keys:
            assert after[key] == pytest.approx(before[key], rel=0, abs=1e-6), (before["step"], key)


def truncate(states: Path) -> None:
    """Cut a checkpoint file short, as a crash in the middle of writing it would."""
    states.write_bytes(states.read_bytes()[:1000])


def crash_plugin(directory: Path, step: int) -> Path:
    """A plugin file whose ``rlhf_step_end`` raises after ``step``: a crash mid-run, for resume tests."""
    path = directory / f"crash_after_step_{step}.py"
    path.write_text("import rlhf\n\nrlhf_plugin_api = rlhf.PLUGIN_API_VERSION\n\n\n@rlhf.hookimpl\n"
                    f"def rlhf_step_end(step, metrics):\n    if step == {step}:\n"
                    f"        raise RuntimeError('simulated crash after step {step}')\n")
    return path


def pause_plugin(directory: Path, step: int, seconds: float) -> Path:
    """A plugin file whose ``rlhf_step_end`` of ``step`` touches ``<plugin>.step<N>`` and then pauses ``seconds``
    (once per run folder: a requeued run that passes the step again goes on), while the test acts on the run."""
    path = directory / f"pause_at_step_{step}.py"
    path.write_text("import pathlib, time\nimport rlhf\n\nrlhf_plugin_api = rlhf.PLUGIN_API_VERSION\n\n\n"
                    "@rlhf.hookimpl\ndef rlhf_step_end(step, metrics):\n"
                    f"    mark = pathlib.Path(__file__).with_suffix('.step{step}')\n"
                    f"    if step == {step} and not mark.exists():\n        mark.touch()\n        time.sleep({seconds})\n")
    return path


def processes_mentioning(text: str) -> list[str]:
    """Processes whose command line names ``text``, or that hold a file under it open: Ray's agents retitle
    themselves (``ray::DashboardAgent``) but keep their log files in the session folder open."""
    from rlhf.runtime.cluster.watchdog import session_processes

    holding = set(session_processes(text, {os.getpid()}))
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and entry.name != str(os.getpid()):
            try:
                command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:  # exited meanwhile, or not ours to read
                continue
            if text in command or int(entry.name) in holding:
                found.append(f"{entry.name}: {command[:200]}")
    return found


def wait_until_none_left(ray_tmpdir: str, seconds: float = 60) -> list[str]:
    """The processes of a run's own Ray session under ``ray_tmpdir`` still alive after ``seconds`` (Ray's processes
    exit shortly after the driver's shutdown)."""
    import time

    deadline = time.monotonic() + seconds
    while (left := processes_mentioning(ray_tmpdir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


class TwoNodeCluster:
    """The two-node Ray cluster of ``engine_checks/two_node_cluster.py`` in a process of its own (under ``ray_tmpdir``);
    ``address`` is its GCS address (give it to a run as ``RAY_ADDRESS``)."""

    def __init__(self, ray_tmpdir: str) -> None:
        self.process = subprocess.Popen([sys.executable, str(Path(__file__).parent / "engine_checks" / "two_node_cluster.py")], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, env=child_env(RAY_TMPDIR=ray_tmpdir))
        self.address = self.process.stdout.readline().strip()
        assert self.address, "the two-node cluster did not start"

    def ask(self, what: str) -> list[str]:
        self.process.stdin.write(what + "\n")
        self.process.stdin.flush()
        return json.loads(self.process.stdout.readline())

    def close(self) -> None:
        end_stdin_server(self.process, timeout=120)


def end_stdin_server(process: subprocess.Popen, timeout: float) -> None:
    """End a helper process that serves requests read from its stdin: closing stdin ends its loop; one that has not
    ended within ``timeout`` seconds is killed."""
    process.stdin.close()
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()


_RUNS_IN_TURN = """\
import json, os, sys
from rlhf.testing.cli import run_in_process
commands, report = json.loads(open(sys.argv[1]).read()), sys.argv[2] + "." + os.environ["RANK"]
results = [run_in_process(*argv) for argv in commands]
open(report, "w").write(json.dumps([[done.returncode, done.stderr] for done in results]))
"""


def runs_in_turn(workdir: Path, ranks: int, *commands: tuple[str, ...]) -> list[subprocess.CompletedProcess[str]]:
    """``rlhf COMMAND`` for each command in turn, all in one torchrun launch of ``ranks`` ranks: each run joins the
    group the first one set up (rlhf.distributed), so the runs after the first pay no interpreters, imports or
    rendezvous of their own. Each run is reported as run_rlhf reports a launch: the highest status of its ranks
    and their stderr, joined (rank 0 first)."""
    workdir.mkdir(parents=True, exist_ok=True)
    script, listed, report = workdir / "runs_in_turn.py", workdir / "commands.json", workdir / "report"
    script.write_text(_RUNS_IN_TURN)
    listed.write_text(json.dumps([list(command) for command in commands]))
    launch = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                             str(ranks), str(script), str(listed), str(report)],
                            capture_output=True, text=True, timeout=900, env=child_env(RLHF_NO_PROGRESS="1", HF_HUB_OFFLINE="1"))
    assert launch.returncode == 0, f"exit {launch.returncode}:\n{launch.stderr[-4000:]}"
    per_rank = [json.loads(Path(f"{report}.{rank}").read_text()) for rank in range(ranks)]
    return [subprocess.CompletedProcess(list(command), max(rank[i][0] for rank in per_rank),
                                        "", "".join(rank[i][1] for rank in per_rank))
            for i, command in enumerate(commands)]
