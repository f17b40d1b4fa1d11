"""textarena's games played through the environment executor: the library's own game, its rewards and its end."""

from __future__ import annotations

import pytest
from rlhf_plugin_textarena.games import GameOptions, GameSeeds, TextArenaExecutor, TextArenaGame

from rlhf.testing.conformance import AgentExecutorKit, PromptSourceKit, ppo_config

SAMPLING = {"temperature": 1.0, "top_p": 1.0}


def run_config(model_path, **options):
    config = ppo_config()
    config.actor.model_name_or_path = str(model_path)
    config.data.max_len = 2000
    config.rollout.max_new_tokens = 6
    config.plugins["textarena"] = {"env_id": "GuessTheNumber-v0", **options}
    return config


class Guesser:
    """An engine that plays "[1]", "[2]", … : turn k (counted by the assistant tags in its prompt) guesses k."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.tag = tokenizer("<|assistant|>", add_special_tokens=False)["input_ids"]

    def generate(self, requests, temperature, top_p):
        out = []
        for request in requests:
            ids = request["prompt_ids"]
            turn = sum(ids[i:i + len(self.tag)] == self.tag for i in range(len(ids)))
            move = self.tokenizer(f"[{turn}]", add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            out.append({"response_ids": move, "logprobs": [-0.5] * len(move), "finish_reason": "stop"})
        return out


def replayed(seed: int, moves: int) -> tuple[float, list[str]]:
    """The game as textarena plays it alone: the player's reward after guessing 1, 2, … and the game's replies."""
    import textarena

    game = textarena.make(env_id="GuessTheNumber-v0-raw")
    game.reset(num_players=1, seed=seed)
    game.get_observation()  # the game's prompt: the episode's first user turn
    replies = []
    for guess in range(1, moves + 1):
        done, _ = game.step(action=f"[{guess}]")
        if done:
            return float(game.close()[0][0]), replies
        replies.append("\n".join(m for sender, m, _ in game.get_observation()[1] if sender != 0))
    raise AssertionError("the game did not end")


def test_a_game_is_played_in_chat_turns_and_its_end_is_the_libraries(tiny_causal_lm_path) -> None:
    executor = TextArenaExecutor.from_config(run_config(tiny_causal_lm_path))
    tokenizer = executor.tokenizer
    seeds = GameSeeds.from_config(run_config(tiny_causal_lm_path)).rows(0, 2)
    requests = []
    for group, row in enumerate(seeds):
        messages = [{"role": "user", "content": row["input"]}]
        prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        requests.append({"prompt": prompt, "prompt_ids": tokenizer(prompt, add_special_tokens=False)["input_ids"],
                         "messages": messages, "label": None, "fields": row, "max_tokens": 6, "seed": group,
                         "group": group})
    for row, result in zip(seeds, executor.run(requests, Guesser(tokenizer), SAMPLING)):
        reward, replies = replayed(row["game_seed"], 20)
        assert result["finish_reason"] == "stop" and result["agent"]["reward"] == reward
        assert result["agent"]["turns"] == len(replies) + 1
        # the game's own prompt replaced the row's, as the first user turn; each reply is a templated user turn
        assert "You are Player 0. You are playing Guess The Number." in result["prompt"]
        feedback = [i for i, m in zip(result["response_ids"], result["action_mask"]) if m == 0]
        assert tokenizer.decode(feedback) == "".join(f"<|user|>{reply}</s><|assistant|>" for reply in replies)


def test_prompt_rows_seed_their_games() -> None:
    rows = GameSeeds(GameOptions(env_id="GuessTheNumber-v0"), 7, "input").rows(0, 5)
    assert len({row["game_seed"] for row in rows}) == 5
    assert GameSeeds(GameOptions(), 7, "input").rows(3, 2) == rows[3:]


class TestTextArenaKit(AgentExecutorKit):
    plugin_module, registered_name = "rlhf_plugin_textarena", "textarena"

    @pytest.fixture(autouse=True)
    def _model(self, tiny_causal_lm_path) -> None:
        self.model_path = tiny_causal_lm_path

    def make_component(self):
        return TextArenaExecutor.from_config(run_config(self.model_path))


class TestGameSeedsKit(PromptSourceKit):
    component = GameSeeds
    plugin_module, registered_name = "rlhf_plugin_textarena", "textarena"


def test_the_environment_class_is_the_libraries_game() -> None:
    game = TextArenaGame(GameOptions(env_id="GuessTheNumber-v0"))
    assert type(game.game).__module__.startswith("textarena")
