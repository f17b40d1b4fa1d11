"""The reward stage of the controller: the reward manager, then shaping rules.

Runs in the controller, once per generated batch (``reward``) and once per rollout batch
after filtering (``shape``). The reward manager (``--reward.manager``) gets the run's reward
sources: registered reward functions by name, the agent executor's own rewards, and the
reward-model worker groups the controller attaches to :attr:`RewardStage.reward_models`.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from rlhf.components import RewardBatch, RewardSources, build
from rlhf.config.base import ConfigError
from rlhf.registry import ComponentKind as K
from rlhf.reward_output import RewardOutput
from rlhf.reward_terms import call_reward
from rlhf.runtime.rollout.agents import agent_reward
from rlhf.runtime.workers.batch import Sample

if TYPE_CHECKING:
    from rlhf.config.ppo import PPOConfig


def reward_model_paths(config: PPOConfig) -> list[str]:
    """One reward model per path of ``--reward.model_name_or_path a,b``; none with ``--reward.remote_url``,
    which replaces them (OpenRLHF's rule)."""
    if config.reward.remote_url:
        return []
    return [p for p in (config.reward.model_name_or_path or "").split(",") if p]


class RewardStage:
    """``agent_rewards``: the agent executor's environments reward the episodes (OpenRLHF's
    ``--train.agent_func_path``); the manager gets them as :attr:`rlhf.components.RewardSources.agent`."""

    def __init__(self, config: PPOConfig, registry: Any, agent_rewards: bool = False) -> None:
        self.reward_model_paths = reward_model_paths(config)
        self.reward_models: list[Any] = []  # WorkerGroups, one per path, attached by the controller at launch
        self.agent_rewards = agent_rewards
        agent = None
        if agent_rewards:
            source = (f"--train.agent_func_path {config.train.agent_func_path}" if config.train.agent_func_path
                      else f"--train.agent_executor {config.train.agent_executor}")
            agent = functools.partial(call_reward, agent_reward, source=source)

        def function(name: str, flag: str) -> Any:
            built = build(registry.get(K.REWARD_FUNCTION, name, flag=flag), config)
            if getattr(built, "needs_labels", False) and not config.data.label_key:  # else it scores empty labels
                raise ConfigError(f"{flag} {name}: this reward function compares responses with each prompt's label, "
                                  "but --data.label_key is not set: name the dataset key that holds the labels (or set "
                                  "needs_labels = False on the function if it does not read them)")
            return functools.partial(call_reward, built, source=f"reward function {name!r} ({flag})")

        sources = RewardSources(config, function, agent,
                                [functools.partial(self._reward_model, i) for i in range(len(self.reward_model_paths))])
        self.manager = registry.get(K.REWARD_MANAGER, config.reward.manager, flag="--reward.manager")(sources)
        shapers = [build(reg.load(), config) for reg in registry.registrations(K.REWARD_SHAPER)]
        self.shapers = sorted((s for s in shapers if s.active), key=lambda s: s.order)

    def _reward_model(self, index: int, queries: list[str], prompts: list[str], labels: list[Any], **columns: Any) -> Any:
        rewards = self.reward_models[index].call_split(
            "rewards", {"prompt_ids": columns["prompt_ids"], "response_ids": columns["response_ids"]})
        return RewardOutput(rewards, list(rewards))

    def reward(self, samples: list[Sample]) -> tuple[dict[str, float], set[int]]:
        """Reward every sample; returns the manager's logs and the groups it left out of this step."""
        columns: dict[str, list[Any]] = {"prompt_ids": [s.prompt_ids for s in samples],
                                         "response_ids": [s.response_ids for s in samples],
                                         "finish_reasons": [s.finish_reason for s in samples],
                                         "fields": [s.fields for s in samples]}
        if self.agent_rewards:
            columns["agents"] = [s.agent for s in samples]
        out = self.manager(RewardBatch([s.prompt + s.response for s in samples], [s.prompt for s in samples],
                                       [s.label for s in samples], columns))
        for i, (sample, reward, score) in enumerate(zip(samples, out.rewards, out.scores)):
            sample.reward, sample.score = float(reward), float(score)
            sample.terms = {name: float(values[i]) for name, values in out.terms.items()}
            sample.columns = {name: values[i] for name, values in out.columns.items()}
        return out.logs, {samples[i].group for i in out.skipped}

    def shape(self, samples: list[Sample]) -> None:
        """Active shaping rules, in their order, on the scalar rewards (before the group step)."""
        if not self.shapers:
            return
        import torch

        rewards = torch.tensor([s.reward for s in samples], dtype=torch.float32)
        info = {"response_lengths": torch.tensor([len(s.response_ids) for s in samples]),
                "truncated": torch.tensor([s.finish_reason == "length" for s in samples])}
        for shaper in self.shapers:
            rewards = shaper.apply(rewards, info)
        for sample, reward in zip(samples, rewards.tolist()):
            sample.reward = reward
