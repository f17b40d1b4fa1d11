"""OpenRLHF reward files: what a broken file says, and whether reward_func needs labels."""

from __future__ import annotations

import shutil
import tempfile
import textwrap
from pathlib import Path

import pytest
from rlhf_plugin_reward_func.file_reward import RewardFuncFile

from rlhf.errors import RewardSourceError
from rlhf.testing.conformance import RewardFunctionKit, ppo_config


def write(tmp_path: Path, source: str, name: str = "reward.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def load_error(path: Path | str) -> str:
    with pytest.raises(RewardSourceError) as caught:
        RewardFuncFile(str(path))
    return str(caught.value)


def test_a_working_file_is_called_with_openrlhfs_arguments(tmp_path: Path) -> None:
    path = write(tmp_path, """
        def reward_func(queries, prompts, labels, **kwargs):
            return [float(q.endswith(label)) for q, label in zip(queries, labels)]
    """)
    assert RewardFuncFile(str(path))(["Q: 2", "Q: 3"], ["Q:", "Q:"], ["2", "2"]) == [1.0, 0.0]


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    message = load_error(tmp_path / "nope.py")
    assert "--reward.remote_url" in message and "nope.py" in message and "no such file" in message


def test_a_directory_is_not_a_reward_file(tmp_path: Path) -> None:
    (tmp_path / "rewards.py").mkdir()
    message = load_error(tmp_path / "rewards.py")
    assert "rewards.py is a directory" in message and "reward_func(queries, prompts, labels" in message


def test_a_syntax_error_names_the_file_and_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        def reward_func(queries, prompts, labels):
            return [1.0 for q in queries

        x = 1
    """)
    message = load_error(path)
    assert str(path) in message and "line 2" in message and "syntax error" in message


def test_an_exception_at_import_names_the_file_the_line_and_the_exception(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        import json

        import no_such_reward_helper

        def reward_func(queries, prompts, labels):
            return [0.0] * len(queries)
    """)
    message = load_error(path)
    assert str(path) in message and "line 3" in message
    assert "ModuleNotFoundError" in message and "no_such_reward_helper" in message


def test_a_misspelt_reward_func_lists_the_names_and_suggests_the_closest(tmp_path: Path) -> None:
    path = write(tmp_path, """
        from os.path import join

        def reward_fn(queries, prompts, labels):
            return [0.0] * len(queries)

        def helper(x):
            return x
    """)
    message = load_error(path)
    assert "defines no reward_func" in message and "helper, reward_fn" in message
    assert "Did you mean 'reward_fn'?" in message and "join" not in message  # imported, not defined by the file


def test_a_reward_func_that_is_not_callable_is_refused(tmp_path: Path) -> None:
    message = load_error(write(tmp_path, "reward_func = 3\n"))
    assert "reward_func is a int, not a function" in message


def test_an_exception_inside_reward_func_names_the_file_and_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, """\
        def reward_func(queries, prompts, labels):
            scores = {"a": 1.0}
            return [scores[q] for q in queries]
    """)
    reward = RewardFuncFile(str(path))
    with pytest.raises(RewardSourceError) as caught:
        reward(["b"], [""], [""])
    message = str(caught.value)
    assert str(path) in message and "line 3" in message and "KeyError: 'b'" in message
    assert isinstance(caught.value.__cause__, KeyError)
    from rlhf_plugin_weighted_rewards.terms import CompositeReward, TermSpec

    from rlhf.reward_terms import call_reward

    composite = CompositeReward([(TermSpec("reward_func_file"),
                                  lambda q, p, labels, **c: call_reward(reward, q, p, labels, source="file", **c))])
    with pytest.raises(RewardSourceError) as caught:
        composite(["b"], [""], [""])
    assert str(path) in str(caught.value) and str(caught.value).count("--reward.on_error") == 1  # the advice, once


@pytest.mark.parametrize(("source", "needs"), [
    ("def reward_func(queries, prompts, labels):\n    return [float(q == l) for q, l in zip(queries, labels)]\n", True),
    ("def reward_func(queries, prompts, labels, **kw):\n    return [0.0] * len(queries)\n", False),
    # the third parameter counts whatever its name
    ("def reward_func(q, p, answers):\n    return [float(a in x) for x, a in zip(q, answers)]\n", True),
    ("async def reward_func(q, p, labels):\n    return [len(labels)] * len(q)\n", True),
    # used only by a helper defined inside the body
    ("def reward_func(q, p, labels):\n    def one(i):\n        return float(labels[i] in q[i])\n"
     "    return [one(i) for i in range(len(q))]\n", True),
    # assigned but never read
    ("def reward_func(q, p, labels):\n    labels = None\n    return [0.0] * len(q)\n", False),
    # the last definition is the one the module binds
    ("def reward_func(q, p, labels):\n    return labels\n\ndef reward_func(q, p, labels):\n    return [0.0] * len(q)\n", False),
    # not readable from the source: never refuse a run on a guess
    ("def reward_func(*args):\n    return [0.0] * len(args[0])\n", False),
    ("def make():\n    return lambda q, p, labels: [float(bool(labels))] * len(q)\n\nreward_func = make()\n", False),
])
def test_needs_labels_is_read_from_the_source(tmp_path: Path, source: str, needs: bool) -> None:
    assert RewardFuncFile(str(write(tmp_path, source))).needs_labels is needs


def test_an_attribute_set_in_the_file_overrides_the_guess(tmp_path: Path) -> None:
    path = write(tmp_path, """
        def reward_func(queries, prompts, labels):
            return [0.0 if labels is None else 1.0] * len(queries)

        reward_func.needs_labels = False
    """)
    assert RewardFuncFile(str(path)).needs_labels is False


class TestRewardFuncFileContract(RewardFunctionKit):
    """The reward-function kit on a working OpenRLHF reward file, built as the runtime builds it."""

    component, plugin_module, registered_name = RewardFuncFile, "rlhf_plugin_reward_func", "reward_func_file"

    @classmethod
    def setup_class(cls) -> None:
        cls.directory = Path(tempfile.mkdtemp(prefix="reward-func-kit-"))
        write(cls.directory, """
            def reward_func(queries, prompts, labels, **kwargs):
                return {"rewards": [float(str(l) in q[len(p):]) for q, p, l in zip(queries, prompts, labels)],
                        "extra_logs": {"length": [len(q) - len(p) for q, p in zip(queries, prompts)]}}
        """)

    @classmethod
    def teardown_class(cls) -> None:
        shutil.rmtree(cls.directory, ignore_errors=True)

    def run_config(self):
        config = ppo_config()
        config.reward.remote_url = str(self.directory / "reward.py")
        return config
