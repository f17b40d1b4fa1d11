"""Checkpoints, resume and saves of ``rlhf train ppo``: nothing lost, nothing silent.

One short run that crashes after step 3 (its checkpoint is at step 2) is shared: its resume must
log each step once, and copies of its checkpoint, damaged one way each, must stop a resume with one
``rlhf: error:`` line naming the checkpoint. These runs are ``rlhf``'s ``main`` in this process, on
the session's shared Ray cluster (exit status and stderr as the command gives them: the command's
own process is not what they test). Full disks are real, through the real command: a
small tmpfs mounted in a user+mount namespace (``unshare -rm``) under ``--ckpt.path`` or
``--ckpt.output_dir``, visible only to the run, which starts its own Ray cluster inside it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from rlhf_test_support import base_flags, crash_plugin, truncate

from rlhf.records.metrics import read_metrics
from rlhf.testing.cli import assert_ok, assert_user_error, child_env, run_in_process

pytestmark = pytest.mark.slow

def ppo_flags(model: Path, task_files: dict[str, Path], run: Path, steps: int) -> list[str]:
    return ["train", "ppo", *base_flags(model, task_files["prompts"], run, "hf", steps),
            "--reward.remote_url", str(task_files["reward"]), "--algo.advantage.estimator", "group_norm",
            "--rollout.n_samples_per_prompt", "2", "--train.batch_size", "8", "--algo.kl.init_coef", "0"]


@pytest.fixture(scope="module")
def crashed(tmp_path_factory, tiny_causal_lm_path, task_files, ray_cluster) -> Path:
    """A 4-step run with --ckpt.load_enable (nothing to resume yet) that crashed after step 3; checkpoint at step 2."""
    run = tmp_path_factory.mktemp("crashed")
    plugin = crash_plugin(run, 3)
    result = run_in_process("--plugins", str(plugin), *ppo_flags(tiny_causal_lm_path, task_files, run, steps=4),
                        "--ckpt.save_steps", "2", "--ckpt.load_enable", "--logger.tensorboard_dir", str(run / "tb"))
    assert result.returncode != 0 and "simulated crash after step 3" in result.stderr
    assert f"WARNING rlhf.checkpoint: --ckpt.load_enable: no checkpoint under {run / 'ckpt'}; starting from step 0" \
        in result.stderr
    assert [m["step"] for m in read_metrics(run / "out")] == [1, 2, 3]
    assert sorted(p.name for p in (run / "ckpt").iterdir()) == ["global_step2"]
    return run


def test_a_resume_says_where_it_resumed_from_and_logs_each_step_once(crashed, tiny_causal_lm_path, task_files,
                                                                      tmp_path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run = tmp_path / "run"
    shutil.copytree(crashed, run)
    result = assert_ok(run_in_process(*ppo_flags(tiny_causal_lm_path, task_files, run, steps=4), "--ckpt.save_steps", "2",
                                  "--ckpt.load_enable", "--logger.tensorboard_dir", str(run / "tb")))
    assert f"WARNING rlhf.checkpoint: --ckpt.load_enable: resumed from {run / 'ckpt' / 'global_step2'} (step 2)" \
        in result.stderr
    assert [m["step"] for m in read_metrics(run / "out")] == [1, 2, 3, 4]  # step 3 of the crashed run was dropped
    events = EventAccumulator(str(run / "tb"))
    events.Reload()
    assert [e.step for e in events.Scalars("reward")] == [1, 2, 3, 4]  # TensorBoard purged it too


# a deleted states file or state.json is refused before any engine is touched: core/tests/test_checkpoint_files.py
def test_a_truncated_checkpoint_stops_the_resume_with_one_line(crashed, tiny_causal_lm_path, task_files, tmp_path) -> None:
    shutil.copytree(crashed / "ckpt", tmp_path / "ckpt")
    truncate(tmp_path / "ckpt" / "global_step2" / "actor" / "mp_rank_00_model_states.pt")
    result = run_in_process(*ppo_flags(tiny_causal_lm_path, task_files, tmp_path, steps=4), "--ckpt.load_enable")
    assert_user_error(result, f"checkpoint {tmp_path / 'ckpt' / 'global_step2' / 'actor'} cannot be loaded",
                      "truncated or corrupt", f"delete {tmp_path / 'ckpt' / 'global_step2'}", "drop --ckpt.load_enable")


def test_a_checkpoint_of_another_model_size_stops_the_resume(crashed, tiny_tokenizer_path, task_files, tmp_path) -> None:
    from rlhf.testing.tiny import build_causal_lm

    wider = build_causal_lm(tmp_path / "wider", tiny_tokenizer_path, hidden_size=256)
    shutil.copytree(crashed / "ckpt", tmp_path / "ckpt")
    result = run_in_process(*ppo_flags(wider, task_files, tmp_path, steps=4), "--ckpt.load_enable")
    assert_user_error(result, str(tmp_path / "ckpt" / "global_step2" / "actor"), "another size",
                      "[512, 128] there, [512, 256] in the model being trained")


# SFT's resume (where it says it resumed from, each step logged once, a truncated checkpoint refused) is
# checked on the run of tests/test_supervised_resume.py that compares it with the uninterrupted run.


# ------------------------------------------------------------------------------------- full disks


def run_on_small_disk(mountpoint: Path, size: str, listing: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``rlhf ARGS`` with a fresh ``size`` tmpfs on ``mountpoint``; the tmpfs exists only in the command's
    namespace, so what it holds when the command ends is written to ``listing`` (path and size per line)."""
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode != 0:
        pytest.skip("user+mount namespaces (unshare -rm) are not available here")
    script = ('mount -t tmpfs -o size="$1" tmpfs "$2" || exit 97; disk=$2; listing=$3; shift 3; "$@"; code=$?; '
              'find "$disk" -mindepth 1 -printf "%P %s\\n" > "$listing"; exit $code')
    env = child_env(RLHF_NO_PROGRESS="1", HF_HUB_OFFLINE="1")
    return subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", size, str(mountpoint), str(listing),
                           sys.executable, "-m", "rlhf", *args], capture_output=True, text=True, env=env, timeout=300)


def _listed(listing: Path) -> dict[str, int]:
    return {path: int(size) for path, size in (line.rsplit(" ", 1) for line in listing.read_text().splitlines())}


def test_a_full_disk_during_a_checkpoint_keeps_the_previous_one(tiny_causal_lm_path, task_files, tmp_path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    # one checkpoint of the tiny actor (model + Adam states) takes about 6 MB: the first fits, the second does not
    result = run_on_small_disk(ckpt, "9m", tmp_path / "listing", *ppo_flags(tiny_causal_lm_path, task_files, tmp_path, 2),
                               "--ckpt.save_steps", "1")
    assert_user_error(result, f"writing checkpoint {ckpt / 'global_step2'} failed", "No space left on device")
    left = _listed(tmp_path / "listing")
    assert not [path for path in left if path.startswith(".staging")]
    assert {"global_step1/state.json", "global_step1/actor/mp_rank_00_model_states.pt"} <= set(left)
    assert not [path for path in left if path.startswith("global_step2")]


def test_a_full_disk_during_the_final_save_leaves_no_partial_model(tiny_causal_lm_path, task_files, tmp_path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    # the metrics and config fit in 1 MB, the tiny actor's weights (about 1.7 MB) do not
    result = run_on_small_disk(out, "1m", tmp_path / "listing", *ppo_flags(tiny_causal_lm_path, task_files, tmp_path, 2))
    assert_user_error(result, f"writing model {out} failed", "No space left on device")
    # the run's log and its failed status fit too; no model file, whole or partial
    assert sorted(_listed(tmp_path / "listing")) == ["metrics.jsonl", "rlhf.log", "rlhf_config.yaml", "run_status.json",
                                                    "workers.json"]
