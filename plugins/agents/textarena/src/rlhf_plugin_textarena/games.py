"""textarena games as rlhf environments: one game per episode, moves in, the game's messages out as chat turns."""

from __future__ import annotations

import random
from typing import Any

from pydantic import Field
from rlhf_agents import AgentInstanceBase
from rlhf_agents.episodes import EnvironmentExecutor, EpisodeOptions

#: the row field carrying the game's seed (GameSeeds writes it; any prompt file may too)
SEED_FIELD = "game_seed"


class GameOptions(EpisodeOptions):
    env_id: str = Field("GuessTheNumber-v0", description="the textarena game (its registered id)")
    size: int | None = Field(None, ge=1, description="games per episode of the prompt source (default: --data.max_samples)")


class TextArenaGame(AgentInstanceBase):
    """One single-player game. textarena's raw variant of the game answers structured messages, so only the game's
    own messages since the last move become the next user turn (the player's move is already the model's turn)."""

    Options = GameOptions

    def __init__(self, options: GameOptions) -> None:
        import textarena

        self.options = options
        raw = f"{options.env_id}-raw"
        self.game = textarena.make(env_id=raw if raw in textarena.envs.registration.ENV_REGISTRY else options.env_id)

    async def reset(self, states: dict[str, Any]) -> dict[str, Any]:
        # a row without a seed plays game 0: the n samples of a prompt must play one game, and a rerun the same
        self.game.reset(num_players=1, seed=int((states.get("fields") or {}).get(SEED_FIELD, 0)))
        told = self._told()
        if states.get("messages") is not None:
            return {"messages": [{"role": "user", "content": told}]}
        return {"observation": told}

    async def step(self, states: dict[str, Any]) -> dict[str, Any]:
        done, _info = self.game.step(action=states["action_text"])
        if done:
            rewards, game_info = self.game.close()
            outcome = game_info.get(0, {})
            return {"rewards": float(rewards.get(0, 0.0)), "done": True,
                    "extra_logs": {"invalid_move": float(bool(outcome.get("invalid_move"))),
                                   "turns": float(outcome.get("turn_count", 0))},
                    "columns": {"game_end": str(outcome.get("reason", ""))}}
        told = self._told()
        reply = ({"environment_messages": [{"role": "user", "content": told}]} if states.get("messages") is not None
                 else {"environment_feedback": "\n" + told + "\n"})
        return {"rewards": 0.0, "done": False, **reply}

    def _told(self) -> str:
        """The game's messages since the player's last move (the raw variant's list), or its text (other variants)."""
        _player, observation = self.game.get_observation()
        if isinstance(observation, str):
            return observation
        return "\n".join(message for sender, message, _kind in observation if sender != 0)


class TextArenaExecutor(EnvironmentExecutor):
    @classmethod
    def from_config(cls, config: Any) -> TextArenaExecutor:
        return cls.for_run(TextArenaGame, config, source=f"textarena {config.plugins.get('textarena', {}).get('env_id', '')}",
                           namespace="textarena")


class GameSeeds:
    """A :class:`rlhf.components.PromptSource`: row p is one game, seeded by the run's seed and p."""

    def __init__(self, options: GameOptions, seed: int, input_key: str) -> None:
        self.options, self.seed, self.input_key, self.size = options, seed, input_key, options.size

    @classmethod
    def from_config(cls, config: Any) -> GameSeeds:
        return cls(GameOptions.model_validate(config.plugins.get("textarena", {})), config.train.seed, config.data.input_key)

    def rows(self, start: int, count: int) -> list[dict[str, Any]]:
        return [{self.input_key: f"Play {self.options.env_id}.",
                 SEED_FIELD: random.Random(f"{self.seed}:{position}").getrandbits(31)}
                for position in range(start, start + count)]
