"""User mistakes through the real ``rlhf`` command: each ends with exit 2 and one ``rlhf: error:`` line
that names the file and row, flag, plugin, URL or worker at fault, and no traceback (unless --debug).

The first table is refused before any worker runs: each case goes through the CLI's parsing, the
trainer's config rules and the controller's checks of the sources and of every prompt row in this
process (the same calls, without Ray: a data mistake is found while Ray and the workers start, 17 s a
case through the command), and a few of them, one per kind of mistake, through the real command. The
runs below it fail mid-run, in a Ray worker or a plugin hook, and are marked slow: a dead worker named with its
log is the real command (the run's own cluster routes its workers' output to the run's log); a worker dying inside a
weight sync, a raising hook, NaN rewards and a reward server that is down run ``rlhf``'s ``main`` in this process on
the session's shared Ray cluster (the same exit status and stderr).
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
from rlhf_test_support import base_flags

from rlhf.console import RUN_LOG_NAME
from rlhf.distributed import free_port
from rlhf.errors import DataError, PluginError, render_exit
from rlhf.testing.cli import assert_user_error, refused_in_process, run_in_process, run_rlhf

GRPO = ["--algo.advantage.estimator", "group_norm", "--rollout.n_samples_per_prompt", "2", "--train.batch_size", "8",
        "--algo.kl.init_coef", "0"]


@pytest.fixture(scope="module")
def bad(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of broken inputs, one per mistake."""
    root = tmp_path_factory.mktemp("mistakes")
    files = {
        "empty.jsonl": "",
        "broken.jsonl": '{"input": "1+1=", "label": "2"}\n{"input": "2+2=", "label": }\n',
        "int_input.jsonl": '{"input": "1+1=", "label": "2"}\n{"input": 7, "label": "7"}\n',
        "list_input.jsonl": '{"input": "1+1=", "label": "2"}\n{"input": ["a", "b"], "label": "7"}\n',
        "no_input.jsonl": '{"input": "1+1=", "label": "2"}\n{"question": "2+2=", "label": "4"}\n',
        "long.jsonl": "".join(json.dumps({"input": "count " * (60 if i == 3 else 1), "label": "1"}) + "\n" for i in range(8)),
        "syntax.py": "def reward_func(queries, prompts, labels):\n    return [1.0 for q in queries\n",
        "misspelled.py": "def reward_fn(queries, prompts, labels):\n    return [0.0] * len(queries)\n",
        "no_config/README": "not a model\n",
        "run.yaml": "train:\n  batch_size: 8\n  micro_batch_sizee: 4\n",
    }
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def assert_nothing_but_the_log(run_dir: Path) -> None:
    """A refused run leaves at most its log (rlhf.log: library warnings and logs of the attempt) in its dir."""
    assert not run_dir.exists() or {p.name for p in run_dir.iterdir()} <= {RUN_LOG_NAME}


def train_flags(model: Path, prompts: Path, reward: Path, run: Path, *extra: str, steps: int = 2) -> list[str]:
    return [*base_flags(model, prompts, run, "hf", steps), "--reward.remote_url", str(reward), *GRPO, *extra]


def train(model: Path, prompts: Path, reward: Path, run: Path, *extra: str, steps: int = 2):
    return run_rlhf("train", "ppo", *train_flags(model, prompts, reward, run, *extra, steps=steps), timeout=300)


def train_in_process(model: Path, prompts: Path, reward: Path, run: Path, *extra: str,
                     steps: int = 2) -> subprocess.CompletedProcess[str]:
    """``rlhf train ppo`` as :func:`train` runs it, but ``rlhf``'s ``main`` in this process, on the session's shared
    Ray cluster (for a mistake found mid-run, where the command's own process is not what is tested): the exit
    status and what it printed to stderr, as the command would give them."""
    return run_in_process("train", "ppo", *train_flags(model, prompts, reward, run, *extra, steps=steps))


CASES = {
    # name: (extra flags, what the line must name); "{bad}" is the folder of broken inputs
    "missing dataset": (["--data.prompt_dataset", "{bad}/nope.jsonl"], ["--data.prompt_dataset", "nope.jsonl", "no such file"]),
    "empty dataset": (["--data.prompt_dataset", "{bad}/empty.jsonl"], ["empty.jsonl", "empty"]),
    "malformed json line": (["--data.prompt_dataset", "{bad}/broken.jsonl"], ["broken.jsonl", "line 2", "not valid JSON"]),
    "int input": (["--data.prompt_dataset", "{bad}/int_input.jsonl"], ["int_input.jsonl", "row 1", "an int"]),
    "list input": (["--data.prompt_dataset", "{bad}/list_input.jsonl"], ["list_input.jsonl", "row 1", "chat messages"]),
    "missing input key": (["--data.prompt_dataset", "{bad}/no_input.jsonl"], ["no_input.jsonl", "row 1", "--data.input_key"]),
    "over-long prompt refused": (["--data.prompt_dataset", "{bad}/long.jsonl", "--data.max_len", "40",
                                  "--data.on_invalid_prompt", "error"], ["long.jsonl", "(row 3)", "--data.max_len 40"]),
    "batch size 0": (["--train.batch_size", "0"], ["--train.batch_size", "at least 1"]),
    "micro-batch size 0": (["--train.micro_batch_size", "0"], ["--train.micro_batch_size", "at least 1"]),
    "batch not divisible": (["--train.batch_size", "12"], ["--train.batch_size 12", "--train.micro_batch_size 8"]),
    "probs not numbers": (["--data.prompt_dataset", "{prompts},{prompts}", "--data.prompt_probs", "a,b"],
                          ["--data.prompt_probs", "number"]),
    "probs sum to 0": (["--data.prompt_dataset", "{prompts},{prompts}", "--data.prompt_probs", "0,0"],
                       ["--data.prompt_probs", "sums to 0"]),
    "probs do not sum to 1": (["--data.prompt_dataset", "{prompts},{prompts}", "--data.prompt_probs", "0.3,0.3"],
                              ["--data.prompt_probs", "sum to 1"]),
    "negative max new tokens": (["--rollout.max_new_tokens", "-5"], ["--rollout.max_new_tokens", "at least 1"]),
    "model path missing": (["--actor.model_name_or_path", "{bad}/no_model"], ["--actor.model_name_or_path", "no_model"]),
    "model path not a model": (["--actor.model_name_or_path", "{bad}/no_config"], ["--actor.model_name_or_path", "no config.json"]),
    "reward file missing": (["--reward.remote_url", "{bad}/missing_reward.py"], ["missing_reward.py"]),
    "reward file syntax error": (["--reward.remote_url", "{bad}/syntax.py"], ["syntax.py", "line 2"]),
    "reward file without reward_func": (["--reward.remote_url", "{bad}/misspelled.py"], ["misspelled.py", "reward_func"]),
    "labels needed but no label key": (["--reward.remote_url", "", "--reward.functions", "math_answer", "--data.label_key", ""],
                                       ["math_answer", "--data.label_key"]),
    "unknown flag": (["--train.batch_sise", "8"], ["--train.batch_sise", "--train.batch_size"]),
    "not an integer": (["--train.seed", "abc"], ["--train.seed", "integer", "abc"]),
    "not one of the choices": (["--data.on_invalid_prompt", "maybe"], ["--data.on_invalid_prompt", "'maybe'", "filter"]),
    "bad yaml key": (["--config", "{bad}/run.yaml"], ["run.yaml", "micro_batch_sizee"]),
    "unknown estimator": (["--algo.advantage.estimator", "grpoo"], ["--algo.advantage.estimator", "grpoo"]),
    "plugins no: without a name": (["--plugins", "no:"], ["--plugins", "no:"]),
    "plugin file missing": (["--plugins", "{bad}/my_plugin.py"], ["my_plugin.py"]),
    "dump dir is a file": (["--rollout.dump_dir", "{bad}/empty.jsonl/rollouts"],
                           ["--rollout.dump_dir", "empty.jsonl is a file, not a directory"]),
    "unknown sync backend": (["--vllm.sync_backend", "mpi"], ["--vllm.sync_backend", "'mpi'", "gloo"]),
    "gloo sync with LoRA": (["--vllm.sync_backend", "gloo", "--ds.lora.rank", "4"], ["--vllm.sync_backend gloo", "--ds.lora.rank"]),
    "nccl sync without CUDA": (["--vllm.sync_backend", "nccl"], ["--vllm.sync_backend nccl", "no CUDA", "object_store"]),
    "ipc sync without CUDA": (["--vllm.sync_backend", "ipc"], ["--vllm.sync_backend ipc", "no CUDA", "object_store"]),
    "in-process ranks with two reference ranks": (["--train.in_process", "on", "--algo.kl.init_coef", "0.01",
                                                   "--ref.num_gpus_per_node", "2"], ["--train.in_process on", "ref has 2 ranks"]),
}
#: cases whose mistake exists only on a machine without CUDA
CPU_ONLY_CASES = {"nccl sync without CUDA", "ipc sync without CUDA"}


def _case_params() -> list:
    import torch

    no_cuda_here = pytest.mark.skipif(torch.cuda.is_available(), reason="the mistake is nccl on a machine without CUDA")
    return [pytest.param(case, marks=no_cuda_here) if case in CPU_ONLY_CASES else case for case in CASES]


#: one case of each kind through the real command: a flag, a model path, a reward file, a plugin, a prompt row
#: (found while Ray and the workers start, as a bad image row is: the run must stop them and leave nothing behind)
COMMAND_CASES = ["unknown flag", "model path not a model", "reward file syntax error", "plugin file missing",
                 "malformed json line"]


def refused_before_the_workers(capsys: pytest.CaptureFixture[str], run: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """``rlhf train ppo ARGV`` in this process as far as a run goes before its workers can fail: the config,
    then the controller's checks of the sources and of every prompt row (rlhf's own calls, without Ray)."""
    from rlhf.runtime.control.controller import PPOController

    return refused_in_process(capsys, "ppo", *argv, then=lambda config, host: PPOController(config, host, run)._check_inputs())


def case_flags(case: str, bad: Path, task_files: dict[str, Path]) -> tuple[list[str], list[str]]:
    extra, names = CASES[case]
    return [e.format(bad=bad, prompts=task_files["prompts"]) for e in extra], names


@pytest.mark.parametrize("case", _case_params())
def test_a_mistake_before_the_run_is_one_line(case, bad, tiny_causal_lm_path, task_files, tmp_path, capsys) -> None:
    extra, names = case_flags(case, bad, task_files)
    flags = train_flags(tiny_causal_lm_path, task_files["prompts"], task_files["reward"], tmp_path, *extra)
    assert_user_error(refused_before_the_workers(capsys, tmp_path / "out", *flags), *names)
    assert_nothing_but_the_log(tmp_path / "out")


@pytest.mark.parametrize("case", COMMAND_CASES)
def test_a_mistake_before_the_run_reaches_the_user_as_one_line(case, bad, tiny_causal_lm_path, task_files,
                                                               tmp_path) -> None:
    extra, names = case_flags(case, bad, task_files)
    result = train(tiny_causal_lm_path, task_files["prompts"], task_files["reward"], tmp_path, *extra)
    assert_user_error(result, *names)
    assert_nothing_but_the_log(tmp_path / "out")  # refused before writing anything


@pytest.mark.timeout(60)  # without the check this run would take over five minutes
@pytest.mark.parametrize("form", ["host:port", "ray://host:port"])
def test_a_ray_address_where_nothing_listens_is_one_line(form, tiny_causal_lm_path, task_files, tmp_path,
                                                         monkeypatch) -> None:
    """RAY_ADDRESS naming a closed port (a cluster that is down): refused at once, where Ray itself
    would retry for minutes (20 attempts of 30 s for a GCS address, 30 s for ray://). ("auto" is not
    tried here: with exactly one Ray running anywhere on the machine, Ray joins that one.) ``rlhf``'s ``main``
    in this process: the refusal comes before any Ray connects, this process's included."""
    port = free_port()  # bound, then closed: nothing listens there
    address = {"host:port": f"127.0.0.1:{port}", "ray://host:port": f"ray://127.0.0.1:{port}"}[form]
    flags = train_flags(tiny_causal_lm_path, task_files["prompts"], task_files["reward"], tmp_path, steps=1)
    monkeypatch.setenv("RAY_ADDRESS", address)
    result = run_in_process("train", "ppo", *flags)
    assert_user_error(result, f"RAY_ADDRESS={address}", f":{port}", "nothing answers", "ray start --head",
                      "unset RAY_ADDRESS")
    assert_nothing_but_the_log(tmp_path / "out")


def test_debug_adds_the_traceback_and_keeps_the_exit_status(bad, tiny_causal_lm_path, task_files, tmp_path) -> None:
    result = train(tiny_causal_lm_path, task_files["prompts"], bad / "syntax.py", tmp_path, "--debug")
    assert result.returncode == 2 and "Traceback" in result.stderr and "RewardSourceError" in result.stderr
    assert result.stderr.strip().splitlines()[-1].startswith("rlhf: error:")


def test_a_path_rlhf_checkpoint_cannot_read_is_one_line(tmp_path) -> None:
    """`rlhf checkpoint inspect|export` of a directory that holds no checkpoint, of a step that does not exist (not
    "incomplete or damaged; delete it"), and an export whose model is gone (it was the hub's OSError about the path)."""
    run = tmp_path / "ckpt"
    (run / "global_step3" / "actor").mkdir(parents=True)
    (run / "global_step3" / "actor" / "weights").write_text("x")
    (run / "global_step3" / "state.json").write_text(json.dumps(
        {"step": 3, "models": {"actor": {"backend": "deepspeed", "model": str(tmp_path / "moved"), "world_size": 1}}}))
    for action, extra in {"inspect": [], "export": ["--model", "actor", "--out", str(tmp_path / "hf")]}.items():
        assert_user_error(run_in_process("checkpoint", action, str(tmp_path), *extra),
                          f"{tmp_path} is neither a checkpoint (global_step<N>/) nor a --ckpt.path with one")
        assert_user_error(run_in_process("checkpoint", action, str(run / "global_step9"), *extra),
                          f"{run / 'global_step9'}: no such checkpoint ({run} holds steps 3)")
    export = ["checkpoint", "export", str(run), "--model", "actor", "--out", str(tmp_path / "hf")]
    assert_user_error(run_in_process(*export), f"--base {tmp_path / 'moved'}: no such model directory",
                      "give the model the run started from with --base")
    assert_user_error(run_in_process(*export, "--base", str(tmp_path / "gone")), f"--base {tmp_path / 'gone'}")


def test_a_bug_is_an_internal_error_with_exit_1(capsys) -> None:
    assert render_exit(KeyError("missing"), debug=False) == 1
    assert render_exit(_chained(), debug=False) == 2  # a user error found behind another exception
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("rlhf: internal error: KeyError: 'missing'") and "--debug" in err[0]
    assert err[1] == "rlhf: error: plugin 'x' failed"


def _chained() -> BaseException:
    try:
        try:
            raise PluginError("plugin 'x' failed")
        except PluginError as inner:
            raise RuntimeError("outer") from inner
    except RuntimeError as outer:
        return outer


# --------------------------------------------------------------------- failures mid-run (Ray workers)

HOOK_PLUGINS = {
    "step_end": "@rlhf.hookimpl\ndef rlhf_step_end(step, metrics):\n    raise KeyError('loss_total')\n",
    "worker_init": ("@rlhf.hookimpl\ndef rlhf_worker_init(role, rank, config):\n"
                    "    if role == 'actor':\n        raise RuntimeError('cannot reach the metrics service')\n"),
}


@pytest.mark.slow
@pytest.mark.parametrize("hook", list(HOOK_PLUGINS))
def test_a_plugin_raising_in_a_hook_is_named_with_its_hook(hook, tiny_causal_lm_path, task_files, ray_cluster,
                                                           tmp_path) -> None:
    plugin = tmp_path / f"observer_{hook}.py"
    plugin.write_text(f"import rlhf\nrlhf_plugin_api = rlhf.PLUGIN_API_VERSION\n\n{HOOK_PLUGINS[hook]}")
    result = train_in_process(tiny_causal_lm_path, task_files["prompts"], task_files["reward"], tmp_path, "--plugins", str(plugin))
    assert_user_error(result, f"plugin 'observer_{hook}'", f"rlhf_{hook}", str(plugin))


KILLER = '''
import os, threading, time
from pathlib import Path
import rlhf
rlhf_plugin_api = rlhf.PLUGIN_API_VERSION
SIGNAL = Path(__file__).with_suffix(".die")

@rlhf.hookimpl
def rlhf_worker_init(role, rank, config):
    if role == "actor":  # the actor process dies once the controller has finished step 1
        def watch():
            while not SIGNAL.exists():
                time.sleep(0.05)
            os._exit(9)
        threading.Thread(target=watch, daemon=True).start()

@rlhf.hookimpl
def rlhf_step_end(step, metrics):
    SIGNAL.touch()
'''


@pytest.mark.slow
def test_a_dead_ray_worker_is_named_by_group_and_rank(tiny_causal_lm_path, task_files, tmp_path) -> None:
    plugin = tmp_path / "killer.py"
    plugin.write_text(KILLER)
    result = train(tiny_causal_lm_path, task_files["prompts"], task_files["reward"], tmp_path, "--plugins", str(plugin),
                   "--train.in_process", "off", steps=3)
    assert_user_error(result, "Ray worker 'actor' rank 0", "died", "on node ", "read its log", "--ckpt.load_enable")
    log = re.search(r"read its log (\S+?)\);", result.stderr).group(1)
    # every local worker's stdout and stderr go to the run's log (rlhf.console), the dead rank's included
    assert log == str(tmp_path / "out" / "rlhf.log") and Path(log).stat().st_size > 0


# The actor dies inside its first weight sync: at its first broadcast, once the engine has had a moment
# to wait in the same gloo collective. The engine then fails at once ("Connection reset/closed by peer"), well
# before Ray declares the actor's own call failed; the error must still name the dead actor.
DIES_IN_SYNC = """
import os, time
import rlhf
rlhf_plugin_api = rlhf.PLUGIN_API_VERSION

@rlhf.hookimpl
def rlhf_worker_init(role, rank, config):
    if role == "actor":
        from rlhf_plugin_torch_sync.broadcast import BroadcastGroup

        def die(self, tensor):
            time.sleep(1)
            os._exit(9)

        BroadcastGroup.broadcast = die
"""


@pytest.mark.slow
def test_a_worker_dying_in_the_middle_of_a_weight_sync_is_named_not_its_peers_error(tiny_causal_lm_path, task_files,
                                                                                      ray_cluster, tmp_path) -> None:
    """The actor's Ray worker and the engine's are the run's own actors on the session's shared cluster (the death is
    the worker's, not the command's process): the one line names the dead actor, not the engine's gloo error."""
    plugin = tmp_path / "dies_in_sync.py"
    plugin.write_text(DIES_IN_SYNC)
    result = train_in_process(tiny_causal_lm_path, task_files["prompts"], task_files["reward"], tmp_path, "--plugins",
                              str(plugin), "--rollout.engine", "hf", "--vllm.sync_backend", "gloo",  # an engine process to sync into
                              "--train.in_process", "off")  # the actor rank in a Ray worker of its own, to die there
    assert_user_error(result, "Ray worker 'actor' rank 0", "died", "--ckpt.load_enable")


@pytest.mark.slow
def test_nan_rewards_stop_the_run_instead_of_training_on_them(tiny_causal_lm_path, task_files, ray_cluster,
                                                               tmp_path) -> None:
    reward = tmp_path / "nan_reward.py"
    reward.write_text("def reward_func(queries, prompts, labels, **kwargs):\n    return [float('nan')] * len(queries)\n")
    result = train_in_process(tiny_causal_lm_path, task_files["prompts"], reward, tmp_path, "--reward.on_error", "skip-sample")
    assert_user_error(result, "reward_func_file", "non-finite reward nan", "all 8 samples")
    assert not (tmp_path / "out" / "model.safetensors").exists()


@pytest.mark.slow
def test_a_reward_server_that_is_down_names_its_url(tiny_causal_lm_path, task_files, ray_cluster, tmp_path) -> None:
    url = f"http://127.0.0.1:{free_port()}/get_reward"
    result = train_in_process(tiny_causal_lm_path, task_files["prompts"], task_files["reward"], tmp_path, "--reward.remote_url", url,
                   "--remote.retries", "1", "--remote.timeout_s", "2")
    assert_user_error(result, url)


@pytest.mark.slow
def test_a_worker_that_fails_to_start_says_why(ray_cluster) -> None:
    import ray

    from rlhf.errors import WorkerError
    from rlhf.runtime.cluster.liveness import track, wait

    class FailsToStart:  # defined here so Ray ships it by value (tests are not importable in workers)
        def __init__(self, error: Exception) -> None:
            raise error

        def ping(self) -> int:
            return 1

    remote = ray.remote(num_cpus=0)(FailsToStart)
    user = track(remote.remote(DataError("prompts.jsonl row 3: bad")), "rollout engine", 1)
    with pytest.raises(WorkerError, match=r"Ray worker 'rollout engine' rank 1 failed to start: prompts.jsonl row 3: bad$"):
        wait(user.ping.remote())
    bug = track(remote.remote(ZeroDivisionError("division by zero")), "actor", 0)
    with pytest.raises(RuntimeError, match="Ray worker 'actor' rank 0 failed to start: ZeroDivisionError: division by zero") as err:
        wait(bug.ping.remote())
    assert not isinstance(err.value, WorkerError)  # a bug stays an internal error


@pytest.fixture(scope="module")
def bad_images(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Prompt files for a VLM whose row 1 has a broken image (row 0 is fine), one file per mistake."""
    from PIL import Image

    root = tmp_path_factory.mktemp("bad-images")
    good = root / "good.png"
    Image.new("RGB", (56, 56), (200, 20, 20)).save(good)
    (root / "corrupt.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    (root / "truncated.png").write_bytes(good.read_bytes()[: len(good.read_bytes()) // 2])
    rows = {"missing": [str(root / "gone.png")], "corrupt": [str(root / "corrupt.png")],
            "truncated": [str(root / "truncated.png")], "too_many": [str(good)] * 3}
    for name, images in rows.items():
        lines = [{"input": "colour?", "images": [str(good)], "label": "red"}, {"input": "colour?", "images": images, "label": "red"}]
        (root / f"{name}.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return root


IMAGE_CASES = {
    "missing image file": ("missing", ["missing.jsonl row 1", "gone.png", "does not exist"]),
    "corrupt image bytes": ("corrupt", ["corrupt.jsonl row 1", "corrupt.png", "cannot be read as an image"]),
    "truncated image": ("truncated", ["truncated.jsonl row 1", "truncated.png", "cannot be read as an image"]),
    "more images than allowed": ("too_many", ["too_many.jsonl row 1", "3 images", "--data.max_images_per_prompt 2"]),
}


IMAGE_FLAGS = ["--data.image_key", "images", "--data.max_images_per_prompt", "2"]


@pytest.mark.parametrize("case", list(IMAGE_CASES))
def test_a_bad_image_row_is_one_line_naming_the_row(case, bad_images, tiny_vlm_path, task_files, tmp_path, capsys) -> None:
    name, names = IMAGE_CASES[case]
    flags = train_flags(tiny_vlm_path, bad_images / f"{name}.jsonl", task_files["reward"], tmp_path, *IMAGE_FLAGS)
    assert_user_error(refused_before_the_workers(capsys, tmp_path / "out", *flags), *names)


@pytest.mark.parametrize("extra,names", [
    ([], ["--data.image_key", "text-only model", "no vision_config"]),
    (["--plugins", "no:vlm"], ["--data.image_key", "'vlm'", "pip install rlhf-plugin-vlm"]),
], ids=["text-only model", "vlm plugin blocked"])
def test_an_image_key_without_a_vlm_is_one_line(extra, names, bad_images, tiny_causal_lm_path, task_files, tmp_path,
                                               capsys) -> None:
    flags = train_flags(tiny_causal_lm_path, bad_images / "missing.jsonl", task_files["reward"], tmp_path,
                        "--data.image_key", "images", "--data.max_images_per_prompt", "1", *extra)
    assert_user_error(refused_before_the_workers(capsys, tmp_path / "out", *flags), *names)
