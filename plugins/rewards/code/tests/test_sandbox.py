"""Hostile programs end as a zero reward with a reason, and never touch the trainer's machine."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest
from rlhf_plugin_code.reward import CodeTestsReward, extract_code
from rlhf_plugin_code.sandbox import SandboxLimits, run

LIMITS = SandboxLimits(wall_s=5.0, cpu_s=2, memory_mb=256)


def test_passing_and_failing_programs() -> None:
    assert run("def add(a, b):\n    return a + b\nassert add(2, 3) == 5\n", LIMITS).reason == "passed"
    failed = run("assert 1 == 2\n", LIMITS)
    assert (failed.passed, failed.reason) == (False, "failed") and "AssertionError" in failed.stderr


def test_fork_bomb() -> None:
    result = run("import os\nwhile True:\n    os.fork()\n", LIMITS)
    assert (result.passed, result.reason) == (False, "blocked") and "os.fork" in result.stderr


def test_subprocess_is_refused() -> None:
    result = run("import subprocess\nsubprocess.run(['true'])\n", LIMITS)
    assert result.reason == "blocked"


def test_infinite_loop() -> None:
    started = time.perf_counter()
    result = run("while True:\n    pass\n", LIMITS)
    assert result.reason in {"cpu_limit", "timeout"} and not result.passed
    assert time.perf_counter() - started < LIMITS.wall_s + 2


def test_ten_gigabyte_allocation() -> None:
    result = run("x = bytearray(10 * 1024**3)\n", LIMITS)
    assert (result.passed, result.reason) == (False, "memory_limit")


def test_socket_connect_to_a_listening_loopback_server() -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)
        server.settimeout(3)
        port = server.getsockname()[1]
        accepted = []
        thread = threading.Thread(target=lambda: accepted.append(_accept(server)))
        thread.start()
        result = run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n", LIMITS)
        thread.join()
    assert (result.passed, result.reason) == (False, "blocked")
    assert accepted == [False]  # nothing reached the server


def _accept(server: socket.socket) -> bool:
    try:
        server.accept()
        return True
    except OSError:
        return False


def test_write_outside_the_sandbox_dir(tmp_path: Path) -> None:
    target = tmp_path / "evil.txt"
    result = run(f"open({str(target)!r}, 'w').write('pwned')\n", LIMITS)
    assert (result.passed, result.reason) == (False, "blocked")
    assert not target.exists()
    inside = run("open('scratch.txt', 'w').write('fine')\nassert open('scratch.txt').read() == 'fine'\n", LIMITS)
    assert inside.passed


def test_output_is_capped() -> None:
    result = run("print('x' * 10_000_000)\n", SandboxLimits(wall_s=5, cpu_s=2, memory_mb=256, output_kb=4))
    assert not result.passed and result.reason == "output_limit"
    assert len(result.stdout) <= 4 * 1024


def test_reward_counts_reasons() -> None:
    reward = CodeTestsReward(LIMITS)
    prompt = "Write add:"
    responses = ["```python\ndef add(a, b):\n    return a + b\n```</s>", "```python\ndef add(a, b):\n    return a - b\n```",
                 "import os\nos.fork()"]
    out = reward([prompt + r for r in responses], [prompt] * 3, ["assert add(2, 3) == 5"] * 3)
    assert out["rewards"] == [1.0, 0.0, 0.0]
    assert out["extra_logs"] == {"code/passed": [1 / 3], "code/failed": [1 / 3], "code/blocked": [1 / 3]}
    assert extract_code("no fence") == "no fence"


def test_runs_in_its_own_network_namespace_where_the_machine_allows() -> None:
    from rlhf_plugin_code.sandbox import NAMESPACES

    if not NAMESPACES:
        pytest.skip("unshare -rn is not permitted here; the audit hook alone refuses sockets")
    result = run("print(sorted(line.split(':')[0].strip() for line in open('/proc/net/dev').readlines()[2:]))\n", LIMITS)
    assert result.passed and result.stdout.strip() == "['lo']"  # only a loopback device, and it is down
