"""A JIT-build lock left by a killed process is removed; a running build's lock is waited for."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import pytest
from rlhf_plugin_deepspeed.build_lock import STALE_AFTER_S, clear_stale_build_lock


@pytest.fixture()
def op_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    directory = tmp_path / "cpu_adam"
    directory.mkdir()
    (directory / "cpu_adam.so").write_bytes(b"")
    return directory


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_a_lock_with_no_build_since_it_was_taken_is_removed(op_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    lock = op_dir / "lock"
    lock.touch()
    _age(op_dir / "cpu_adam.so", 2 * STALE_AFTER_S + 60)  # built long ago, then a load was killed holding the lock
    _age(lock, STALE_AFTER_S + 60)
    with caplog.at_level(logging.WARNING):
        clear_stale_build_lock("cpu_adam")
    assert not lock.exists()
    assert f"removed {lock}" in caplog.text


@pytest.mark.parametrize("lock_age, output_age", [(60.0, 2 * STALE_AFTER_S), (2 * STALE_AFTER_S, 60.0)],
                         ids=["lock-taken-a-minute-ago", "build-wrote-a-minute-ago"])
def test_a_running_build_keeps_its_lock(op_dir: Path, caplog: pytest.LogCaptureFixture, lock_age: float,
                                        output_age: float) -> None:
    lock = op_dir / "lock"
    lock.touch()
    _age(lock, lock_age)
    _age(op_dir / "cpu_adam.so", output_age)
    with caplog.at_level(logging.WARNING):
        clear_stale_build_lock("cpu_adam")
    assert lock.exists()
    assert "being built by another process" in caplog.text and str(lock) in caplog.text


def test_no_lock_no_message(op_dir: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        clear_stale_build_lock("cpu_adam")
    assert caplog.text == ""
