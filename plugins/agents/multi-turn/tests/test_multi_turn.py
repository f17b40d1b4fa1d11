"""The multi-turn executor on a real HF engine (in-process): masks, log-probs, budgets, batching, failures."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from rlhf_agents import load_agent_class
from rlhf_agents.episodes import EpisodeOptions
from rlhf_plugin_multi_turn.executor import MultiTurnExecutor

from rlhf.errors import ConfigError
from rlhf.testing.conformance import AgentExecutorKit

GUESS_ENV = Path(__file__).parent / "guess_number_env.py"
FEEDBACK = {" higher ", " lower ", " a number please "}
SAMPLING = {"temperature": 1.0, "top_p": 1.0}


@pytest.fixture(scope="module")
def engine(tiny_causal_lm_path):
    from rlhf_plugin_hf_generate.engine import HFEngine

    return HFEngine(str(tiny_causal_lm_path), "fp32", 128, 0, {"vllm": {}})


class CountingEngines:
    """The in-process engine behind the RolloutEngines interface, counting calls and requests."""

    def __init__(self, engine):
        self.engine, self.batches = engine, []

    def generate(self, requests, temperature, top_p):
        self.batches.append(len(requests))
        return self.engine.generate(requests, temperature, top_p)


def executor_for(path: Path, model: Path, *, max_len: int = 128, max_new_tokens: int = 4, timeout: float = 60.0):
    return MultiTurnExecutor(load_agent_class(str(path), ("AgentInstance", "AgentExecutor")), str(model), max_len,
                             max_new_tokens, EpisodeOptions(step_timeout_s=timeout), source=f"--train.agent_func_path {path}",
                             options_flag="--multi_turn.step_timeout_s")


def requests_for(tokenizer, count: int, max_tokens: int = 4):
    prompt = "guess the number"
    ids = tokenizer(prompt)["input_ids"]
    return [{"prompt_ids": ids, "prompt": prompt, "label": str(1 + i % 4), "max_tokens": max_tokens, "seed": i, "group": i}
            for i in range(count)]


def chat_requests(tokenizer, question: str, count: int):
    """requests_for, with the prompt as a run with --data.apply_chat_template makes it: templated, and as messages."""
    messages = [{"role": "user", "content": question}]
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    return [{**r, "prompt": prompt, "messages": messages, "prompt_ids": ids} for r in requests_for(tokenizer, count)]


def spans(mask: list[int]) -> list[tuple[int, int, int]]:
    """``(value, start, end)`` runs of equal mask values."""
    out, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((mask[start], start, i))
            start = i
    return out


class TestMultiTurnKit(AgentExecutorKit):
    """The agent-executor kit on the guess-the-number environment: masks and environment rewards included."""

    plugin_module, registered_name = "rlhf_plugin_multi_turn", "multi_turn"

    @pytest.fixture(autouse=True)
    def _tokenizer(self, tiny_causal_lm_path) -> None:
        self.model_path = tiny_causal_lm_path

    def make_component(self):
        return executor_for(GUESS_ENV, self.model_path)


def test_feedback_tokens_are_masked_and_model_tokens_keep_their_logprobs(engine, tiny_causal_lm_path) -> None:
    import torch

    executor = executor_for(GUESS_ENV, tiny_causal_lm_path)
    tokenizer = executor.tokenizer
    requests = requests_for(tokenizer, 8)
    engines = CountingEngines(engine)
    results = executor.run(requests, engines, SAMPLING)
    multi_turn = [r for r in results if 0 in r["action_mask"]]
    assert multi_turn, "no episode took more than one turn"
    for request, result in zip(requests, results):
        assert len(result["action_mask"]) == len(result["response_ids"]) == len(result["logprobs"])
        for value, start, end in spans(result["action_mask"]):
            text = tokenizer.decode(result["response_ids"][start:end], skip_special_tokens=False)
            if value == 0:  # every masked span decodes to exactly one piece of environment feedback
                assert text in FEEDBACK, text
                assert result["logprobs"][start:end] == [0.0] * (end - start)
        turns = sum(1 for value, _, _ in spans(result["action_mask"]) if value == 1)
        assert turns == result["agent"]["extra_logs"]["turns"]
        # per-turn rollout log-probs equal an HF forward of the whole trajectory at the model's tokens
        tokens = request["prompt_ids"] + result["response_ids"]
        with torch.no_grad():
            logits = engine.model(torch.tensor([tokens])).logits[0, :-1].float()
        forward = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens[1:])[:, None])[:, 0]
        forward = forward[len(request["prompt_ids"]) - 1:]
        mask = torch.tensor(result["action_mask"], dtype=torch.bool)
        assert torch.allclose(torch.tensor(result["logprobs"])[mask], forward[mask], atol=1e-4)
    # the episodes' turns were batched: one engine call per turn index, not one per episode turn
    total_turns = sum(r["agent"]["extra_logs"]["turns"] for r in results)
    assert len(engines.batches) == max(r["agent"]["extra_logs"]["turns"] for r in results) < total_turns
    assert sum(engines.batches) == total_turns


def test_the_length_budget_holds_across_turns(engine, tiny_causal_lm_path) -> None:
    executor = executor_for(GUESS_ENV, tiny_causal_lm_path, max_len=16, max_new_tokens=4)
    requests = requests_for(executor.tokenizer, 6)
    results = executor.run(requests, CountingEngines(engine), SAMPLING)
    for request, result in zip(requests, results):
        assert len(request["prompt_ids"]) + len(result["response_ids"]) <= 16
    assert any(r["finish_reason"] == "length" and len(request["prompt_ids"]) + len(r["response_ids"]) == 16
               for request, r in zip(requests, results)), "no episode reached the --data.max_len budget"


FAILING_ENVS = {
    "raises": "raise RuntimeError('environment exploded')",
    "sleeps": "await asyncio.sleep(30)",
    "no_rewards": "return {'environment_feedback': '', 'done': True}",
}


@pytest.mark.parametrize("kind", sorted(FAILING_ENVS))
def test_a_failing_environment_fails_only_its_episodes(kind, engine, tiny_causal_lm_path, tmp_path) -> None:
    env = tmp_path / f"{kind}.py"
    env.write_text(
        "import asyncio\nfrom rlhf_agents import AgentInstanceBase\n\n\nclass AgentInstance(AgentInstanceBase):\n"
        "    async def reset(self, states):\n        self.label = int(states['label'])\n        return {'observation': states['observation']}\n\n"
        "    async def step(self, states):\n        if self.label % 2 == 0:\n"
        f"            {FAILING_ENVS[kind]}\n"
        "        return {'rewards': 1.0, 'environment_feedback': '', 'done': True}\n")
    executor = executor_for(env, tiny_causal_lm_path, timeout=0.5)
    results = executor.run(requests_for(executor.tokenizer, 4), CountingEngines(engine), SAMPLING)
    errors = [r["agent"].get("error") for r in results]
    assert [e is None for e in errors] == [True, False, True, False]  # labels 1, 2, 3, 4: the even ones fail
    expected = {"raises": "AgentInstance.step raised RuntimeError: environment exploded",
                "sleeps": "AgentInstance.step took more than 0.5 s (--multi_turn.step_timeout_s)",
                "no_rewards": "AgentInstance.step returned a dict without 'rewards'"}[kind]
    assert all(e.startswith(f"--train.agent_func_path {env}: {expected}") for e in errors if e)
    assert [r["agent"].get("reward") for r in results][::2] == [1.0, 1.0]


def test_an_agent_file_without_the_class_names_the_file(tmp_path) -> None:
    env = tmp_path / "empty_env.py"
    env.write_text("class Environment:\n    pass\n")
    with pytest.raises(ConfigError, match=f"--train.agent_func_path {env} defines no class AgentInstance or AgentExecutor"):
        load_agent_class(str(env), ("AgentInstance", "AgentExecutor"))
    broken = tmp_path / "broken_env.py"
    broken.write_text("from openrlhf.utils.agent import AgentInstanceBase\n")
    with pytest.raises(ConfigError, match="from rlhf_agents import"):
        load_agent_class(str(broken), ("AgentInstance",))


def test_an_agent_executor_class_drives_the_engine_itself(engine, tiny_causal_lm_path, tmp_path) -> None:
    """OpenRLHF's AgentExecutor contract: the user's episode, its action ranges become the mask."""
    env = tmp_path / "executor_env.py"
    env.write_text(
        "from rlhf_agents import AgentExecutorBase\n\n\nclass AgentExecutor(AgentExecutorBase):\n"
        "    async def execute(self, prompt, label, sampling_params, max_length, hf_tokenizer, llm_engine, images=None):\n"
        "        tokens = hf_tokenizer(prompt)['input_ids']\n        ranges, logps = [], [0.0] * len(tokens)\n"
        "        for turn in range(2):\n"
        "            out = await llm_engine.generate(tokens, {'max_tokens': 3})\n"
        "            ids = list(out.outputs[0].token_ids)\n"
        "            ranges.append((len(tokens), len(tokens) + len(ids)))\n"
        "            logps += [d[t].logprob for d, t in zip(out.outputs[0].logprobs, ids)]\n"
        "            feedback = hf_tokenizer(' again ', add_special_tokens=False)['input_ids']\n"
        "            tokens = tokens + ids + feedback\n            logps += [0.0] * len(feedback)\n"
        "        return {'observation_tokens': tokens, 'action_ranges': ranges, 'rollout_log_probs': logps,\n"
        "                'truncated': False, 'reward': 0.5, 'scores': 1.0}\n")
    executor = executor_for(env, tiny_causal_lm_path)
    requests = requests_for(executor.tokenizer, 2)
    results = executor.run(requests, CountingEngines(engine), SAMPLING)
    for result in results:
        assert result["agent"] == {"reward": 0.5, "score": 1.0, "extra_logs": {}, "columns": {}}
        runs = spans(result["action_mask"])
        assert [value for value, _, _ in runs] == [1, 0, 1, 0]
        assert executor.tokenizer.decode(result["response_ids"][runs[1][1]:runs[1][2]]) == " again "


def test_episodes_run_concurrently() -> None:
    """Environments that wait (an HTTP call, a sandbox) overlap: 20 episodes of 2 turns make 2 engine calls, not 40."""
    from rlhf_agents.executors import EngineClient

    class InstantEngines:
        def generate(self, requests, temperature, top_p):
            return [{"response_ids": [7], "logprobs": [-1.0], "finish_reason": "stop"} for _ in requests]

    async def episodes():
        client = EngineClient(InstantEngines(), SAMPLING, max_len=64)

        async def one(seed):
            await client.generate([1, 2], 4, seed)
            await asyncio.sleep(0.05)
            return await client.generate([1, 2, 7], 4, seed)

        await asyncio.gather(*(one(i) for i in range(20)))
        return client.engine_calls

    assert asyncio.run(episodes()) == 2


def _sampling_env(tmp_path, returned: str):
    env = tmp_path / "sampling_env.py"
    env.write_text(
        "from rlhf_agents import AgentInstanceBase\n\n\nclass AgentInstance(AgentInstanceBase):\n"
        "    async def reset(self, states):\n        self.turn = 0\n        return {'observation': states['observation']}\n\n"
        "    async def step(self, states):\n        self.turn += 1\n"
        f"        return {{'rewards': 0.0, 'environment_feedback': ' again ', 'done': self.turn == 2, 'sampling_params': {returned}}}\n")
    return env


def test_a_steps_sampling_params_apply_to_the_next_turn(engine, tiny_causal_lm_path, tmp_path) -> None:
    """max_tokens 1 and temperature 0 (greedy) asked by step 1 shape turn 2: one token, the argmax."""
    import torch

    env = _sampling_env(tmp_path, "{'max_tokens': 1, 'temperature': 0.0, 'top_p': 1.0, 'seed': 5}")
    executor = executor_for(env, tiny_causal_lm_path, max_new_tokens=6)
    requests = requests_for(executor.tokenizer, 4)
    results = executor.run(requests, CountingEngines(engine), SAMPLING)
    for request, result in zip(requests, results):
        assert "error" not in result["agent"], result["agent"]
        runs = spans(result["action_mask"])
        assert [value for value, _, _ in runs] == [1, 0, 1]
        _, start, end = runs[2]
        assert end - start == 1  # the second turn has the one token asked for
        tokens = request["prompt_ids"] + result["response_ids"][:start]
        with torch.no_grad():
            greedy = int(engine.model(torch.tensor([tokens])).logits[0, -1].argmax())
        assert result["response_ids"][start] == greedy


def test_an_unsupported_sampling_param_fails_the_episode_naming_it(engine, tiny_causal_lm_path, tmp_path) -> None:
    env = _sampling_env(tmp_path, "{'max_tokens': 2, 'stop': ['\\n'], 'top_k': 5}")
    executor = executor_for(env, tiny_causal_lm_path)
    results = executor.run(requests_for(executor.tokenizer, 2), CountingEngines(engine), SAMPLING)
    for result in results:
        assert result["agent"]["error"] == (
            f"--train.agent_func_path {env}: AgentInstance.step sets sampling parameter(s) stop, top_k, which the "
            "rollout engines do not apply per turn (supported: max_tokens, temperature, top_p); remove them")


def test_sampling_params_objects_count_only_fields_changed_from_their_defaults() -> None:
    from rlhf_agents.executors import UnsupportedSampling, turn_sampling

    SamplingParams = pytest.importorskip("vllm").SamplingParams  # vLLM is an extra (rlhf-core[cpu] or [gpu])

    assert turn_sampling(SamplingParams(max_tokens=3, temperature=0.5, seed=1), "x") == \
        {"max_tokens": 3, "temperature": 0.5, "top_p": 1.0}
    with pytest.raises(UnsupportedSampling, match="sets sampling parameter\\(s\\) presence_penalty, "):
        turn_sampling(SamplingParams(max_tokens=3, presence_penalty=0.5), "x")


def test_an_episode_the_environment_ended_is_not_reported_as_cut(engine, tiny_causal_lm_path, tmp_path) -> None:
    """A won game: the environment says done after the first turn, which used its whole token budget (the tiny model
    never stops early in 4 tokens). The episode ends with finish_reason 'stop', so truncated_ratio and the overlong
    and stop-properly penalties leave it alone; an episode the budget cut still ends with 'length'."""
    env = tmp_path / "won.py"
    env.write_text(
        "from rlhf_agents import AgentInstanceBase\n\n\nclass AgentInstance(AgentInstanceBase):\n"
        "    async def reset(self, states):\n        return {'observation': states['observation']}\n\n"
        "    async def step(self, states):\n        return {'rewards': 0.75, 'environment_feedback': ' more ', "
        "'done': states['label'] == '1'}\n")
    executor = executor_for(env, tiny_causal_lm_path, max_len=20)
    results = executor.run(requests_for(executor.tokenizer, 2), CountingEngines(engine), SAMPLING)
    won, cut = results
    assert len(won["response_ids"]) == 4 and won["agent"]["turns"] == 1 and won["agent"]["reward"] == 0.75
    assert won["finish_reason"] == "stop"
    assert cut["finish_reason"] == "length" and cut["agent"]["turns"] > 1


def test_an_environment_takes_options_of_its_own_validated_with_the_runs(engine, tiny_causal_lm_path, tmp_path) -> None:
    """An environment declares ``Options`` (an EpisodeOptions subclass): the plugin's options are validated by it and
    each episode's instance is built with them, so no class attribute carries a run's settings (the outsider's
    workaround); an option it does not take is one ConfigError naming the flag, not pydantic's internal error."""
    from rlhf.testing.conformance import ppo_config

    env = tmp_path / "configured.py"
    env.write_text(
        "from rlhf_agents import AgentInstanceBase\nfrom rlhf_agents.episodes import EpisodeOptions\n\n\n"
        "class GameOptions(EpisodeOptions):\n    prize: float = 1.0\n    board: str = 'small'\n\n\n"
        "class AgentInstance(AgentInstanceBase):\n    Options = GameOptions\n\n"
        "    def __init__(self, options):\n        self.options = options\n\n"
        "    async def reset(self, states):\n        return {'observation': states['observation']}\n\n"
        "    async def step(self, states):\n"
        "        return {'rewards': self.options.prize, 'environment_feedback': '', 'done': True,\n"
        "                'columns': {'board': self.options.board}}\n")
    agent_class = load_agent_class(str(env), ("AgentInstance", "AgentExecutor"))
    config = ppo_config(actor={"model_name_or_path": str(tiny_causal_lm_path)},
                        plugins={"game": {"prize": 0.25, "board": "large", "step_timeout_s": 5}})
    executor = MultiTurnExecutor.for_run(agent_class, config, source="agent executor 'game'", namespace="game")
    assert executor.options.step_timeout_s == 5
    results = executor.run(requests_for(executor.tokenizer, 2), CountingEngines(engine), SAMPLING)
    assert [r["agent"]["reward"] for r in results] == [0.25, 0.25]
    assert [r["agent"]["columns"] for r in results] == [{"board": "large"}] * 2
    wrong = ppo_config(actor={"model_name_or_path": str(tiny_causal_lm_path)}, plugins={"game": {"prizes": 2}})
    with pytest.raises(ConfigError, match=r"agent executor 'game': --game\.prizes: Extra inputs are not permitted "
                                          r"\(the options GameOptions takes: step_timeout_s, prize, board\)"):
        MultiTurnExecutor.for_run(agent_class, wrong, source="agent executor 'game'", namespace="game")


def test_the_kit_fails_an_environment_whose_every_episode_fails(tiny_causal_lm_path, tmp_path) -> None:
    """A reset that always raises made every episode a valid-looking error result, and the kit passed it."""
    from rlhf.testing.conformance import ConformanceFailure
    from rlhf.testing.conformance.parts import check_agent_executor

    env = tmp_path / "broken.py"
    env.write_text("from rlhf_agents import AgentInstanceBase\n\n\nclass AgentInstance(AgentInstanceBase):\n"
                   "    async def reset(self, states):\n        raise KeyError('board')\n\n"
                   "    async def step(self, states):\n        return {'rewards': 0.0, 'environment_feedback': '', 'done': True}\n")
    with pytest.raises(ConformanceFailure, match=r"episodes that run.*all 4 episodes failed, the first with: .*"
                                                 r"AgentInstance.reset raised KeyError: 'board'"):
        check_agent_executor(executor_for(env, tiny_causal_lm_path))


def test_an_environment_talks_in_chat_turns_templated_after_the_models_own(engine, tiny_causal_lm_path, tmp_path) -> None:
    """With the run's prompts templated as chat, reset and step see the conversation as messages, and a step's
    ``environment_messages`` become a user turn in the policy's chat template, appended to the model's sampled
    tokens (mask 0), with the assistant's closing token where the model's turn did not emit it."""
    env = tmp_path / "chat.py"
    env.write_text(
        "from rlhf_agents import AgentInstanceBase\n\n\nclass AgentInstance(AgentInstanceBase):\n"
        "    async def reset(self, states):\n        self.first = states['messages']\n"
        "        return {'observation': states['observation']}\n\n"
        "    async def step(self, states):\n        roles = [m['role'] for m in states['messages']]\n"
        "        return {'rewards': 1.0, 'environment_messages': [{'role': 'user', 'content': 'higher'}],\n"
        "                'done': len(roles) >= 4, 'columns': {'roles': ','.join(roles), 'asked': self.first[0]['content']}}\n")
    executor = executor_for(env, tiny_causal_lm_path, max_len=80)
    tokenizer = executor.tokenizer
    (request,) = chat_requests(tokenizer, "guess the number", 1)
    (result,) = executor.run([request], CountingEngines(engine), SAMPLING)
    assert result["agent"]["columns"] == {"roles": "user,assistant,user,assistant", "asked": "guess the number"}
    (feedback,) = [(start, end) for value, start, end in spans(result["action_mask"]) if value == 0]
    turn = result["response_ids"][:feedback[0]]
    closing = "" if turn[-1] == tokenizer.eos_token_id else "</s>"  # the tiny model rarely stops in 4 tokens
    assert tokenizer.decode(result["response_ids"][slice(*feedback)]) == f"{closing}<|user|>higher</s><|assistant|>"

    both = tmp_path / "both.py"
    both.write_text(env.read_text().replace("'environment_messages'", "'environment_feedback': 'x', 'environment_messages'"))
    (failed,) = executor_for(both, tiny_causal_lm_path).run([request], CountingEngines(engine), SAMPLING)
    assert "both environment_feedback and environment_messages" in failed["agent"]["error"]
    pictured = tmp_path / "pictured.py"
    pictured.write_text(env.read_text().replace("'environment_messages'", "'environment_images': ['a.png'], 'environment_messages'"))
    (failed,) = executor_for(pictured, tiny_causal_lm_path).run([request], CountingEngines(engine), SAMPLING)
    assert "environment_images with environment_messages" in failed["agent"]["error"]


class RecordingEngines(CountingEngines):
    """Records every turn the engine was asked for and what it answered."""

    def __init__(self, engine):
        super().__init__(engine)
        self.turns = []

    def generate(self, requests, temperature, top_p):
        out = super().generate(requests, temperature, top_p)
        self.turns += [(list(r["prompt_ids"]), list(o["response_ids"])) for r, o in zip(requests, out)]
        return out


def test_the_ids_trained_are_the_ids_the_engine_saw_and_sampled_across_chat_turns(engine, tiny_causal_lm_path,
                                                                                 tmp_path) -> None:
    """Token-exact: each turn's engine input is a prefix of the trajectory the trainer gets (prompt_ids +
    response_ids), and each turn's sampled ids sit right after it with mask 1; nothing was re-tokenized."""
    env = tmp_path / "chat.py"
    env.write_text(
        "from rlhf_agents import AgentInstanceBase\n\n\nclass AgentInstance(AgentInstanceBase):\n"
        "    async def reset(self, states):\n        return {'messages': states['messages']}\n\n"
        "    async def step(self, states):\n        turns = sum(m['role'] == 'assistant' for m in states['messages'])\n"
        "        return {'rewards': 0.5, 'environment_messages': [{'role': 'user', 'content': f'turn {turns}: go on'}],\n"
        "                'done': turns >= 3}\n")
    executor = executor_for(env, tiny_causal_lm_path, max_len=120)
    tokenizer = executor.tokenizer
    requests = chat_requests(tokenizer, "count with me", 3)
    engines = RecordingEngines(engine)
    results = executor.run(requests, engines, SAMPLING)
    for result in results:
        trained = result.get("prompt_ids", requests[0]["prompt_ids"]) + result["response_ids"]
        mask = [0] * (len(trained) - len(result["action_mask"])) + result["action_mask"]
        turns = [(seen, sampled) for seen, sampled in engines.turns if trained[:len(seen) + len(sampled)] == seen + sampled]
        assert len(turns) == result["agent"]["turns"] == 3
        for seen, sampled in turns:
            assert mask[len(seen):len(seen) + len(sampled)] == [1] * len(sampled)
        assert sum(mask) == sum(len(sampled) for _, sampled in turns)  # every trained token was sampled
