"""The sample table during a run, and ``rlhf rollouts show|summary`` on a dump."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from rlhf_plugin_rollouts.command import RolloutsCommand

from rlhf.host.plugin_host import PluginHost
from rlhf.host.selection import PluginSelection
from rlhf.records.rollouts import RolloutDump
from rlhf.testing.cli import assert_user_error
from rlhf.testing.conformance import CommandKit, LifecycleObserverKit, kit_rollout_samples, ppo_config


class TestRolloutsHooks(LifecycleObserverKit):
    plugin_module = "rlhf_plugin_rollouts"


class TestRolloutsCommand(CommandKit):
    plugin_module = "rlhf_plugin_rollouts"
    component = RolloutsCommand
    registered_name = "rollouts"

    def argv(self) -> list[str] | None:
        return ["summary", str(dump_of(Path(tempfile.mkdtemp()) / "rollouts", range(1, 3)))]


def dump_of(directory: Path, steps: range) -> Path:
    dump = RolloutDump(directory)
    for step in steps:
        dump.write(step, kit_rollout_samples(step, trained=True))
    return directory


def test_a_logged_step_and_every_evaluation_print_their_table(capsys) -> None:
    host = PluginHost.load(PluginSelection.parse("rollouts", strict=True))
    host.train_start(ppo_config(logger={"samples": 2, "logging_steps": 2}), Path("."))
    for step in (1, 2):
        host.rollout_samples(step, "train", kit_rollout_samples(step, trained=True))
    host.rollout_samples(1, "eval", kit_rollout_samples(1, trained=False))
    out = capsys.readouterr().out
    assert "step 1 samples" not in out  # --logger.logging_steps 2
    assert "step 2 samples (2 of 4)" in out and "step 1 evaluation samples (2 of 4)" in out
    # two of four samples, spread over the batch: one per prompt; each term and each plugin column has a column
    assert "answer 0" in out and "answer 2" in out and "answer 1" not in out
    assert "kit_term" in out and "output 2" in out and "question 1" in out


def test_show_sorts_greps_and_limits_a_step(tmp_path: Path, capsys) -> None:
    from rlhf.cli.main import main

    dump = dump_of(tmp_path / "rollouts", range(1, 4))
    assert main(["rollouts", "show", str(dump), "--sort", "length", "--limit", "3"]) == 0
    out = capsys.readouterr().out
    assert "step 3, 3 of 4 samples" in out
    assert main(["rollouts", "show", str(dump), "--step", "2", "--grep", "answer 3"]) == 0
    out = capsys.readouterr().out
    assert "step 2, 1 of 1 samples containing 'answer 3'" in out and "answer 3" in out and "answer 1" not in out
    assert "length" in out  # its finish reason: cut at the limit


def test_summary_gives_each_steps_figures_and_draws_the_chart(tmp_path: Path, capsys) -> None:
    from rlhf_plugin_rollouts.summary import step_summary

    from rlhf.cli.main import main

    samples = kit_rollout_samples(1, trained=True)
    samples[1]["response"] = samples[0]["response"]  # prompt 0's two responses alike
    figures = step_summary(samples)
    mask = [[1, 1, 1], [1, 1, 1], [1, 0, 1], [1, 1, 1]]
    engine, trainer = [-0.5, -1.0, -0.25], [-0.4, -1.1, -0.2]
    mismatch = [sum(abs(t - e) * m for t, e, m in zip(trainer, engine, row)) / sum(row) for row in mask]
    assert figures == pytest.approx({"samples": 4, "reward": 0.5, "reward/kit_term": 0.5, "length": 3.0, "cut": 0.25,
                                     "identical": 0.5, "mismatch": sum(mismatch) / 4})
    dump = dump_of(tmp_path / "rollouts", range(1, 3))
    chart = tmp_path / "chart.png"
    assert main(["rollouts", "summary", str(dump), "--chart", str(chart)]) == 0
    out = capsys.readouterr().out
    assert "rollouts by step" in out and "cut %" in out and "25.0" in out and "reward/kit_term" in out
    assert chart.stat().st_size > 10_000


def test_a_folder_without_rollouts_or_a_missing_step_is_one_error_line(tmp_path: Path) -> None:
    from rlhf.testing.cli import run_rlhf

    assert_user_error(run_rlhf("rollouts", "summary", str(tmp_path)), "no step_<N>.parquet file there")
    dump = dump_of(tmp_path / "rollouts", range(1, 3))
    assert_user_error(run_rlhf("rollouts", "show", str(dump), "--step", "7"), "holds steps 1-2")
