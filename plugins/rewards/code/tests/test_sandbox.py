"""Hostile programs end as a zero reward with a reason, and never touch the trainer's machine.

Every backend this machine can run is tested (``bwrap``, ``unshare``, ``weak``); one it cannot run is skipped
with the reason. The operating-system boundary tests run on the strong backends only: ``weak`` fails them by
design, which ``test_weak_isolation_is_only_an_audit_hook`` shows, so each such test is known to be able to fail.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import sys
import sysconfig
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from rlhf_plugin_code import sandbox
from rlhf_plugin_code.reward import CodeTestsReward, extract_code
from rlhf_plugin_code.sandbox import SandboxLimits, run

from rlhf.errors import ConfigError

ADD = "def add(a, b):\n    return a + b\n"
WRONG_ADD = "def add(a, b):\n    return a - b\n"
ADD_TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n"


def limits(isolation: str, **overrides) -> SandboxLimits:
    return SandboxLimits(**{"wall_s": 5.0, "cpu_s": 2, "memory_mb": 256, "isolation": isolation, **overrides})


def _available(name: str) -> str:
    try:
        return sandbox.backend(name)
    except ConfigError as exc:
        pytest.skip(str(exc))


@pytest.fixture(params=["bwrap", "unshare", "weak"])
def isolation(request: pytest.FixtureRequest) -> str:
    return _available(request.param)


@pytest.fixture(params=["bwrap", "unshare"])
def strong(request: pytest.FixtureRequest) -> str:
    return _available(request.param)


def sandbox_processes() -> list[str]:
    """Host processes still running the sandbox's harness."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes() if entry.name.isdigit() else b""
        except OSError:
            continue
        if b"runner.py" in cmdline and b"-I\0-B" in cmdline:
            found.append(entry.name)
    return found


# --- the old hostile programs, on every backend ------------------------------------------------------------------


def test_passing_and_failing_programs(isolation: str) -> None:
    assert run(ADD + "assert add(2, 3) == 5\n", limits(isolation)).reason == "passed"
    failed = run("assert 1 == 2\n", limits(isolation))
    assert (failed.passed, failed.reason) == (False, "failed") and "AssertionError" in failed.stderr


def test_fork_bomb(isolation: str) -> None:
    result = run("import os\nwhile True:\n    os.fork()\n", limits(isolation))
    assert (result.passed, result.reason) == (False, "blocked") and "os.fork" in result.stderr


def test_subprocess_is_refused(isolation: str) -> None:
    assert run("import subprocess\nsubprocess.run(['true'])\n", limits(isolation)).reason == "blocked"


def test_infinite_loop(isolation: str) -> None:
    started = time.perf_counter()
    result = run("while True:\n    pass\n", limits(isolation, cpu_s=1))  # the smallest limit: the loop burns it all
    assert result.reason in {"cpu_limit", "timeout"} and not result.passed
    assert time.perf_counter() - started < 5.0 + 2


def test_ten_gigabyte_allocation(isolation: str) -> None:
    result = run("x = bytearray(10 * 1024**3)\n", limits(isolation))
    assert (result.passed, result.reason) == (False, "memory_limit")


def test_socket_connect_to_a_listening_loopback_server(isolation: str) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        port = server.getsockname()[1]
        result = run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n", limits(isolation))
        # a connect that got through would wait in the listen backlog now that the program has ended
        server.settimeout(0.2)
        with pytest.raises(TimeoutError):
            server.accept()
    assert (result.passed, result.reason) == (False, "blocked")


def test_write_outside_the_sandbox_dir(isolation: str, tmp_path: Path) -> None:
    target = tmp_path / "evil.txt"
    result = run(f"open({str(target)!r}, 'w').write('pwned')\n", limits(isolation))
    assert (result.passed, result.reason) == (False, "blocked")
    assert not target.exists()
    inside = run("open('scratch.txt', 'w').write('fine')\nassert open('scratch.txt').read() == 'fine'\n", limits(isolation))
    assert inside.passed


def test_output_is_capped(isolation: str) -> None:
    result = run("print('x' * 10_000_000)\n", limits(isolation, output_kb=4))
    assert not result.passed and result.reason == "output_limit"
    assert len(result.stdout) <= 4 * 1024


def test_reward_counts_reasons(isolation: str) -> None:
    reward = CodeTestsReward(limits(isolation))
    prompt = "Write add:"
    responses = ["```python\n" + ADD + "```</s>", "```python\n" + WRONG_ADD + "```", "import os\nos.fork()"]
    out = reward([prompt + r for r in responses], [prompt] * 3, ["assert add(2, 3) == 5"] * 3)
    assert out["rewards"] == [1.0, 0.0, 0.0]
    assert out["extra_logs"] == {"code/passed": [1 / 3], "code/failed": [1 / 3], "code/blocked": [1 / 3]}
    assert extract_code("no fence") == "no fence"


def test_only_a_loopback_interface(isolation: str) -> None:
    if isolation == "weak" and not sandbox._weak_namespaces():
        pytest.skip("unshare -rn is not permitted here; the audit hook alone refuses sockets")
    result = run("import socket\nprint(socket.if_nameindex())\n", limits(isolation, wall_s=30.0))  # a start at high load
    assert result.passed and result.stdout.strip() == "[(1, 'lo')]"  # and the loopback device is down


# --- the result channel: the harness decides, on every backend ----------------------------------------------------


@pytest.mark.parametrize("exit_call", ["import os\nos._exit(0)", "import sys\nsys.exit(0)", "raise SystemExit", "exit()"])
def test_exiting_early_skips_no_test(isolation: str, exit_call: str) -> None:
    wrong = run(f"{WRONG_ADD}{exit_call}\n", limits(isolation), ADD_TESTS)
    assert not wrong.passed and wrong.tests_passed == 0 and wrong.tests_total == 2
    right = run(f"{ADD}{exit_call}\n", limits(isolation), ADD_TESTS)
    assert right.passed == ("_exit" not in exit_call)  # the tests still run after sys.exit; nothing runs after _exit


def test_forged_results_and_always_equal_values_do_not_pass(isolation: str) -> None:
    forge = ('import json, os\nfor fd in range(3, 64):\n    try:\n        os.write(fd, b\'{"loaded": true}\\n'
             '{"i": 0, "ok": true, "value": "0"}\\n{"i": 1, "ok": true, "value": "0"}\\n{"done": true}\\n\')\n'
             '    except OSError:\n        pass\nos._exit(0)\n')
    assert not run(WRONG_ADD + forge, limits(isolation), ADD_TESTS).passed
    deep = forge.replace("os.write(fd, b'", "os.write(fd, b'[' * 200_000 + b'").replace("os._exit(0)", "")
    assert not run(ADD + deep, limits(isolation), ADD_TESTS).passed  # and the reward process survives parsing it
    # A busy caller (Ray, a long pytest run) holds many descriptors, so the pipe's end gets a high number; the
    # forged bytes must still land in the channel the harness reads.
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(100)]
    try:
        assert not run(ADD + deep, limits(isolation), ADD_TESTS).passed
    finally:
        for fd in held:
            os.close(fd)
    always_equal = "class Same:\n    def __eq__(self, other):\n        return True\ndef add(a, b):\n    return Same()\n"
    result = run(always_equal, limits(isolation), ADD_TESTS)
    assert (result.passed, result.tests_passed) == (False, 0)  # it would pass an in-process `assert`


def test_values_are_compared_as_literals_outside() -> None:
    program = ("import collections\ndef counts(s):\n    return collections.Counter(s)\ndef pair():\n    return (1, 2)\n"
               "def ratio():\n    return 0.1 + 0.2\n")
    tests = ("assert counts('aab') == {'a': 2, 'b': 1}\nassert pair() == (1, 2)\nassert [1, 2] == pair()\n"
             "assert ratio() == 0.30000000000000004\nassert sorted(counts('ba')) == ['a', 'b']\n")
    result = run(program, limits("auto"), tests)
    assert (result.passed, result.tests_passed, result.tests_total) == (False, 4, 5)  # a tuple is not a list
    assert run("x = 1\n", limits("auto"), "assert (").reason == "bad_tests"


# --- the operating-system boundary, strong backends ---------------------------------------------------------------


def test_host_files_cannot_be_deleted_or_renamed(strong: str, tmp_path: Path) -> None:
    hidden = tmp_path / "victim.txt"
    hidden.write_text("keep")
    (tmp_path / "tree").mkdir()
    (tmp_path / "tree" / "leaf.txt").write_text("keep")
    stdlib = Path(sysconfig.get_paths()["stdlib"])  # inside the sandbox's read-only view: visible, not writable
    visible = stdlib / f".rlhf-sandbox-probe-{uuid.uuid4().hex}" if os.access(stdlib, os.W_OK) else hidden
    visible.write_text("keep")
    try:
        attacks = [f"os.remove({str(hidden)!r})", f"os.rename({str(hidden)!r}, {str(hidden) + '.moved'!r})",
                   f"shutil.rmtree({str(tmp_path / 'tree')!r})", f"os.unlink({str(tmp_path / 'tree' / 'leaf.txt')!r})",
                   f"os.remove({str(visible)!r})", f"os.replace({str(visible)!r}, 'stolen')"]
        program = "import os, shutil\n" + "".join(f"try:\n    {a}\nexcept Exception as e:\n    print('refused', e)\n"
                                                  for a in attacks)
        result = run(program, limits(strong))
        assert result.passed and result.stdout.count("refused") == len(attacks)
        assert hidden.read_text() == visible.read_text() == (tmp_path / "tree" / "leaf.txt").read_text() == "keep"
        assert not Path(str(hidden) + ".moved").exists()
    finally:
        if visible != hidden:
            visible.unlink(missing_ok=True)


FORK_EXEC = ("import _posixsubprocess, os, sys\nr, w = os.pipe()\n"
             "args = [[b'/bin/sh', b'-c', CMD], [b'/bin/sh'], True, (w,), None, None, -1, -1, -1, -1, -1, -1, r, w, True,"
             " False]\nargs += [-1, None, None, None, -1, None, True] if sys.version_info >= (3, 11) else "
             "[None, None, None, -1, None]\n_posixsubprocess.fork_exec(*args)\n")
SPAWN_ROUTES = {  # route: (code using CMD, the exception that must stop it)
    "_posixsubprocess": (FORK_EXEC, "PermissionError"),  # bypasses the audit hook: only seccomp stops it
    "os.fork": ("import os\nif os.fork() == 0:\n    os.execv('/bin/sh', ['sh', '-c', CMD])\n", "SandboxViolation"),
    "os.execv": ("import os\nos.execv('/bin/sh', ['sh', '-c', CMD])\n", "SandboxViolation"),
    "os.posix_spawn": ("import os\nos.posix_spawn('/bin/sh', ['sh', '-c', CMD], {})\n", "SandboxViolation"),
    "subprocess": ("import subprocess\nsubprocess.run(['sh', '-c', CMD])\n", "SandboxViolation"),
    "os.system": ("import os\nos.system(CMD)\n", "SandboxViolation"),
}


def _spawn_program(route: str, command: str) -> str:
    code = SPAWN_ROUTES[route][0].replace("CMD", repr(command.encode() if route == "_posixsubprocess" else command))
    attempt = "".join(f"    {line}\n" for line in code.splitlines())
    return (f"import os, time\ntry:\n{attempt}except BaseException as exc:\n    print('refused', type(exc).__name__)\n"
            "time.sleep(0.3)\nprint('inner', os.path.exists('inner'))\n")


@pytest.mark.parametrize("route", sorted(SPAWN_ROUTES))
def test_no_process_can_be_spawned(strong: str, route: str, tmp_path: Path) -> None:
    marker = tmp_path / "spawned"
    result = run(_spawn_program(route, f"touch inner; touch {marker}"), limits(strong))
    assert f"refused {SPAWN_ROUTES[route][1]}" in result.stdout and "inner False" in result.stdout, result.stderr
    assert not marker.exists() and sandbox_processes() == []


@pytest.mark.parametrize("path", ["/etc/passwd", "README.md", "test_file"])
def test_host_files_cannot_be_read(isolation: str, path: str) -> None:
    target = Path({"README.md": Path(__file__).parents[4] / "README.md", "test_file": __file__}.get(path, path))
    tests = f"assert open({str(target)!r}).read() == {target.read_text()!r}\n"
    result = run(f"print(open({str(target)!r}).read())\n", limits(isolation), tests)
    readable = isolation == "weak"  # only the weak fallback shows the host's files
    assert (result.passed, result.tests_passed) == (readable, int(readable))
    assert (target.read_text()[:200] in result.stdout) == readable


@pytest.fixture
def home_secret() -> Iterator[Path]:
    """A file in the trainer's home directory ($HOME), removed afterwards."""
    secret = Path.home() / f".rlhf-sandbox-probe-{uuid.uuid4().hex}"
    secret.write_text("a credential in the trainer's home")
    yield secret
    secret.unlink(missing_ok=True)


def test_a_file_in_the_trainers_home_cannot_be_read(isolation: str, home_secret: Path) -> None:
    result = run(f"print(open({str(home_secret)!r}).read())\n", limits(isolation))
    readable = isolation == "weak"  # only the weak fallback shows the host's files
    assert ("a credential in the trainer's home" in result.stdout) == readable
    assert result.passed == readable


def test_the_trainers_environment_is_not_passed_on(isolation: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLHF_TRAINER_SECRET", "trainer-token-123")
    program = (f"import os\nprint('env', os.environ.get('RLHF_TRAINER_SECRET'))\ntry:\n"
               f"    print(open('/proc/{os.getpid()}/environ', 'rb').read())\nexcept OSError as exc:\n    print('refused', exc)\n")
    result = run(program, limits(isolation))
    assert result.passed and "env None" in result.stdout
    if isolation != "weak":  # the weak fallback shares the host's /proc: the trainer's own environ can be read there
        assert "trainer-token-123" not in result.stdout and "refused" in result.stdout


def test_the_view_shows_no_home_and_no_installed_packages(strong: str) -> None:
    """The interpreter's prefix may sit in a home directory (pyenv, conda, uv); only its bin/ and lib/ are shown,
    at /python, and its site-packages (pytest, the trainer's libraries) are covered."""
    prefix = os.path.realpath(sys.base_prefix)
    if prefix == "/usr" or prefix.startswith("/usr/"):
        pytest.skip(f"the interpreter lives in {prefix}, shown where it is")
    relative_site = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"
    site_packages = Path(prefix) / relative_site
    installed = next((p for p in sorted(site_packages.rglob("*.py")) if p.stat().st_size > 0), None)
    home = str(Path.home())
    program = ("import os, sys\n"
               f"print('home', os.path.exists({home!r}) and {home!r} not in ('/', '/usr'))\n"
               f"print('prefix', os.path.exists({prefix!r}))\n"
               f"print('packages', os.listdir(sys.prefix + '/' + {relative_site!r}))\n"
               + "try:\n    import pytest\n    print('imported pytest')\nexcept ImportError:\n    print('no pytest')\n")
    if installed is not None:
        program += f"print('read', os.path.exists({str(installed)!r}))\n"
    result = run(program, limits(strong))
    assert result.passed, result.stderr
    assert "home False" in result.stdout and "prefix False" in result.stdout and "packages []" in result.stdout
    assert "no pytest" in result.stdout and "read True" not in result.stdout


def test_proc_writes_have_no_effect_outside(strong: str) -> None:
    mine = Path(f"/proc/{os.getpid()}/oom_score_adj")
    before = mine.read_text()
    program = "".join(f"try:\n    os.write(os.open({p!r}, os.O_WRONLY), b'1000')\nexcept Exception as e:\n"
                      f"    print('refused', {p!r}, type(e).__name__)\n"
                      for p in ("/proc/self/oom_score_adj", str(mine), "/proc/self/mem", "/proc/1/oom_score_adj"))
    try:
        result = run("import os\n" + program, limits(strong))
        assert result.passed and result.stdout.count("refused") == 4 and mine.read_text() == before
    finally:
        mine.write_text(before)


def test_threads_and_processes_do_not_outlive_the_run(isolation: str) -> None:
    program = ADD + "import threading, time\nthreading.Thread(target=time.sleep, args=(30,)).start()  # not a daemon\n"
    started = time.perf_counter()
    result = run(program, limits(isolation), ADD_TESTS)
    assert result.passed and time.perf_counter() - started < 3.0
    assert sandbox_processes() == []


def test_wall_timeout_kills_everything(isolation: str) -> None:
    program = "import threading, time\nthreading.Thread(target=time.sleep, args=(30,)).start()\ntime.sleep(30)\n"
    started = time.perf_counter()
    result = run(program, limits(isolation, wall_s=1.0), ADD_TESTS)
    assert (result.passed, result.reason) == (False, "timeout") and time.perf_counter() - started < 3.0
    assert sandbox_processes() == []


def test_no_capabilities_and_an_unprivileged_view(strong: str) -> None:
    program = ("import os, socket\ntry:\n    socket.sethostname('owned')\nexcept PermissionError:\n    print('no caps')\n"
               "print(sorted(os.listdir('/')))\n")
    result = run(program, limits(strong))
    assert "no caps" in result.stdout and socket.gethostname() != "owned"
    assert "'work'" not in result.stdout and "'etc'" not in result.stdout and "'proc'" not in result.stdout


def test_weak_isolation_is_only_an_audit_hook() -> None:
    """The attack the strong backends stop, shown to work on the fallback: the boundary tests can fail."""
    result = run(_spawn_program("_posixsubprocess", "touch inner"), limits(_available("weak")))
    assert "inner True" in result.stdout


# --- choosing a backend ------------------------------------------------------------------------------------------


@pytest.fixture
def fresh_choice(monkeypatch: pytest.MonkeyPatch):
    """A process that has not probed yet, with the given executables missing from PATH."""
    def hide(*names: str) -> None:
        which = shutil.which
        monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None if name in names else which(name, *a, **k))
        sandbox._choose.cache_clear()
        sandbox._weak_namespaces.cache_clear()

    yield hide
    sandbox._choose.cache_clear()
    sandbox._weak_namespaces.cache_clear()


def test_without_bubblewrap_or_unshare_one_warning_names_the_fix(fresh_choice, caplog) -> None:
    fresh_choice("bwrap", "unshare")
    with caplog.at_level(logging.WARNING, logger="rlhf_plugin_code.sandbox"):
        assert run(ADD, limits("auto"), ADD_TESTS).passed
        assert run(ADD, limits("auto"), ADD_TESTS).passed
    assert len(caplog.records) == 1
    assert "bubblewrap not found: install it (apt-get install bubblewrap)" in caplog.records[0].getMessage()
    assert "weaker isolation" in caplog.records[0].getMessage()
    with pytest.raises(ConfigError, match="--code.isolation bwrap: unavailable here: bubblewrap not found"):
        CodeTestsReward.from_config(SimpleNamespace(plugins={"code": {"isolation": "bwrap"}}))  # at start, before Ray


def test_without_bubblewrap_unshare_isolates_quietly(fresh_choice, caplog) -> None:
    fresh_choice("bwrap")
    _available("unshare")
    with caplog.at_level(logging.WARNING, logger="rlhf_plugin_code.sandbox"):
        assert sandbox.backend("auto") == "unshare"
    assert caplog.records == []

