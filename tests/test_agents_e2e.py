"""`rlhf train ppo --train.agent_func_path env.py` end to end: the multi-turn executor over real engines."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from rlhf_test_support import base_flags

from rlhf.cli.main import main
from rlhf.records.metrics import read_metrics

pytestmark = pytest.mark.slow

GUESS_ENV = Path(__file__).parents[1] / "plugins" / "agents" / "multi-turn" / "tests" / "guess_number_env.py"


@pytest.fixture(scope="module")
def guess_prompts(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("guess") / "prompts.jsonl"
    rng = random.Random(0)
    path.write_text("".join(json.dumps({"input": "guess the number", "label": str(rng.randint(1, 4))}) + "\n"
                            for _ in range(512)))
    return path


def agent_flags(model: Path, prompts: Path, run: Path, engine: str, steps: int, env: Path = GUESS_ENV) -> list[str]:
    flags = base_flags(model, prompts, run, engine, steps)
    flags[flags.index("--data.max_samples") + 1] = str(16 * steps)
    if engine == "vllm":  # the ranks in this process beside the engine's (one Ray worker fewer to start, 6-8 CPU-s):
        flags[flags.index("--train.in_process") + 1] = "on"  # ZeRO stage 0 leaves no global DeepSpeed state behind
    return flags + ["--train.agent_func_path", str(env), "--algo.advantage.estimator", "group_norm",
                    "--algo.kl.init_coef", "0", "--rollout.batch_size", "16", "--rollout.n_samples_per_prompt", "4",
                    "--rollout.max_new_tokens", "4", "--data.max_len", "96", "--train.batch_size", "64",
                    "--train.micro_batch_size", "64", "--rollout.micro_batch_size", "64", "--actor.adam.lr", "3e-3",
                    "--ds.zero_stage", "0"]


@pytest.mark.parametrize("engine", ["hf", "vllm"])
def test_guess_the_number_learns(engine, ray_cluster, guess_prompts, tiny_causal_lm_path, tmp_path) -> None:
    steps = 20
    assert main(["train", "ppo", *agent_flags(tiny_causal_lm_path, guess_prompts, tmp_path, engine, steps)]) == 0
    metrics = read_metrics(tmp_path / "out")
    assert [m["step"] for m in metrics] == list(range(1, steps + 1))
    rewards = [m["reward"] for m in metrics]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(f"{engine}: mean reward of the first 5 steps {first:.3f}, of the last 5 {last:.3f}")
    assert last > first + 0.05
    assert all(m["score"] >= m["reward"] for m in metrics)  # the environment's scores (solved at all) are used
    assert all(1 <= m["reward/agent/turns"] <= 4 for m in metrics)


FLAKY_ENV = '''
import asyncio
from rlhf_agents import AgentInstanceBase


class AgentInstance(AgentInstanceBase):
    async def reset(self, states):
        self.label = int(states["label"])
        return {"observation": states["observation"]}

    async def step(self, states):
        if self.label == 1:
            raise RuntimeError("environment exploded")
        if self.label == 2:
            await asyncio.sleep(60)
        if self.label == 3:
            return {"environment_feedback": "", "done": True}
        return {"rewards": float("7" in states["action_text"]), "environment_feedback": "", "done": True}
'''


def test_failing_environments_are_counted_or_stop_the_run(ray_cluster, guess_prompts, tiny_causal_lm_path, tmp_path,
                                                          capsys) -> None:
    env = tmp_path / "flaky_env.py"
    env.write_text(FLAKY_ENV)
    flags = agent_flags(tiny_causal_lm_path, guess_prompts, tmp_path, "hf", 1, env) + ["--multi_turn.step_timeout_s", "1"]
    assert main(["train", "ppo", *flags, "--reward.on_error", "zero"]) == 0
    metrics = read_metrics(tmp_path / "out")
    # labels 1, 2, 3 fail (raise, time out, no rewards): 3/4 of 64 samples, about
    assert all(30 <= m["reward_failures/agent"] < 64 for m in metrics)
    capsys.readouterr()
    assert main(["train", "ppo", *flags, "--reward.on_error", "raise", "--ckpt.output_dir", str(tmp_path / "raise")]) == 2
    err = capsys.readouterr().err
    assert f"--train.agent_func_path {env}: AgentInstance.step" in err and "rlhf: error:" in err


def test_dapo_dynamic_filtering_on_agent_scores(ray_cluster, guess_prompts, tiny_causal_lm_path, tmp_path) -> None:
    flags = agent_flags(tiny_causal_lm_path, guess_prompts, tmp_path, "hf", 1) + ["--algo.dynamic_filtering_enable"]
    assert main(["train", "ppo", *flags]) == 0
    metrics = read_metrics(tmp_path / "out")
    assert all(0 < m["dynamic_filtering_pass_rate"] <= 100 for m in metrics)
    # only groups with mixed outcomes are kept: none solved by all four or by none
    assert all(0 < m["score"] < 1 for m in metrics)


def test_an_unknown_executor_lists_the_installed_ones(guess_prompts, tiny_causal_lm_path, tmp_path, capsys) -> None:
    flags = agent_flags(tiny_causal_lm_path, guess_prompts, tmp_path, "hf", 1) + ["--train.agent_executor", "multi_trun"]
    assert main(["train", "ppo", *flags]) == 2
    err = capsys.readouterr().err
    assert "--train.agent_executor 'multi_trun'" in err and "Did you mean 'multi_turn'?" in err and "single_turn" in err


def test_an_openai_sdk_agent_trains_through_the_agent_server(ray_cluster, guess_prompts, tiny_causal_lm_path,
                                                             tmp_path) -> None:
    agent = Path(__file__).parents[1] / "plugins" / "agents" / "openai-server" / "tests" / "guess_number_agent.py"
    flags = agent_flags(tiny_causal_lm_path, guess_prompts, tmp_path, "vllm", 2, agent)  # step 2 after a weight sync
    flags.remove("--data.apply_chat_template")  # the server applies the chat template to the agent's messages
    flags += ["--train.agent_executor", "openai_server", "--data.max_len", "128"]
    assert main(["train", "ppo", *flags]) == 0
    metrics = read_metrics(tmp_path / "out")
    assert [m["step"] for m in metrics] == [1, 2]
    assert all(1 <= m["reward/agent/turns"] <= 4 and "reward_failures/agent" not in m for m in metrics)
    recorded = (tmp_path / "out" / "rlhf_config.yaml").read_text()
    assert "agent_executor: openai_server" in recorded
