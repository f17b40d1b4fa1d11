"""The reward stage of the controller: composite reward terms, then shaping rules.

Runs in the controller, once per generated batch (``reward``) and once per rollout batch
after filtering (``shape``). Reward-model terms call the reward-model worker groups the
controller attaches to :attr:`RewardStage.reward_models`.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

from rlhf.components import build
from rlhf.config.base import ConfigError
from rlhf.registry import ComponentKind as K
from rlhf.reward_output import RewardOutput
from rlhf.reward_terms import CompositeReward, TermSpec, call_reward, parse_terms
from rlhf.runtime.rollout.agents import agent_reward
from rlhf.runtime.workers.batch import Sample

if TYPE_CHECKING:
    from rlhf.config.ppo import PPOConfig

#: The reward term of an agent executor's environments (``--reward.functions agent:W`` weighs it).
AGENT_TERM = "agent"


class RewardStage:
    """``agent_rewards``: the agent executor's environments reward the episodes (OpenRLHF's
    ``--train.agent_func_path``); their results form the term ``agent``, under ``--reward.on_error``. Other reward
    sources of the run (``--reward.functions``, ``--reward.remote_url``, a reward model) are terms beside it; its
    weight is 1 unless ``--reward.functions`` names it (``agent:0.8,format:0.2``), and its scores drive filtering
    and eval unless ``--reward.score_term`` names another term."""

    def __init__(self, config: PPOConfig, registry: Any, agent_rewards: bool = False) -> None:
        self.reward_models: list[Any] = []  # WorkerGroups, one per path in reward_model_paths
        self.agent_rewards = agent_rewards
        source = (f"--train.agent_func_path {config.train.agent_func_path}" if config.train.agent_func_path
                  else f"--train.agent_executor {config.train.agent_executor}")
        agent = functools.partial(call_reward, agent_reward, source=source) if agent_rewards else None
        self.composite = self._terms(config, registry, agent)
        shapers = [build(reg.load(), config) for reg in registry.registrations(K.REWARD_SHAPER)]
        self.shapers = sorted((s for s in shapers if s.active), key=lambda s: s.order)

    def _terms(self, config: PPOConfig, registry: Any, agent: Any = None) -> Any:
        """The composite reward: the environments' term ``agent`` (when ``agent`` is given), ``--reward.functions``
        terms, the ``--reward.remote_url`` file, the reward model."""

        try:
            specs = parse_terms(config.reward.functions, config.reward.on_error)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        terms: list[tuple[TermSpec, Any]] = []
        if agent is not None and AGENT_TERM not in [spec.name for spec in specs]:
            terms.append((TermSpec(AGENT_TERM, 1.0, config.reward.on_error), agent))
        for spec in specs:
            if spec.name == AGENT_TERM and agent is not None:
                terms.append((spec, agent))
                continue
            function = build(registry.get(K.REWARD_FUNCTION, spec.name, flag="--reward.functions"), config)
            _check_labels(function, f"reward function {spec.name!r} (--reward.functions)", config)
            terms.append((spec, functools.partial(call_reward, function, source=f"reward function {spec.name!r}")))
        remote = config.reward.remote_url
        if remote:
            if remote.endswith(".py"):
                name = "reward_func_file"
            elif remote.startswith(("http://", "https://")):
                name = "remote_http"
            else:
                raise ConfigError(f"--reward.remote_url {remote}: give a reward_func .py file or http(s) URL(s)")
            function = build(registry.get(K.REWARD_FUNCTION, name, flag="--reward.remote_url"), config)
            _check_labels(function, f"--reward.remote_url {remote}", config,
                          "; if the file does not need them, set reward_func.needs_labels = False in it")
            terms.append((TermSpec(name, 1.0, config.reward.on_error),
                          functools.partial(call_reward, function, source=f"--reward.remote_url {remote}")))
        # several reward models (--reward.model_name_or_path a,b) are summed, one term each
        self.reward_model_paths = [] if remote else [p for p in (config.reward.model_name_or_path or "").split(",") if p]
        for index, _ in enumerate(self.reward_model_paths):
            name = "reward_model" if len(self.reward_model_paths) == 1 else f"reward_model_{index}"
            terms.append((TermSpec(name, 1.0, config.reward.on_error), functools.partial(self._reward_model_term, index)))
        if not terms:
            raise ConfigError("no reward source: set --reward.functions, --reward.remote_url (a reward_func .py file) "
                              "or --reward.model_name_or_path")
        score_term = config.reward.score_term or (AGENT_TERM if agent is not None else None)
        try:
            return CompositeReward(terms, score_term)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def _reward_model_term(self, index: int, queries: list[str], prompts: list[str], labels: list[Any], **columns: Any) -> Any:
        rewards = self.reward_models[index].call_split(
            "rewards", {"prompt_ids": columns["prompt_ids"], "response_ids": columns["response_ids"]})
        return RewardOutput(rewards, list(rewards))

    def reward(self, samples: list[Sample]) -> tuple[dict[str, float], set[int]]:
        """Reward every sample; returns the per-term logs and the groups a ``skip-sample`` term left out.

        Reward functions get OpenRLHF's arguments plus ``prompt_ids``, ``response_ids`` and
        ``finish_reasons`` keyword columns."""
        agent = {"agents": [s.agent for s in samples]} if self.agent_rewards else {}
        out = self.composite(
            [s.prompt + s.response for s in samples], [s.prompt for s in samples], [s.label for s in samples],
            prompt_ids=[s.prompt_ids for s in samples], response_ids=[s.response_ids for s in samples],
            finish_reasons=[s.finish_reason for s in samples], **agent,
        )
        for sample, reward, score in zip(samples, out.rewards, out.scores):
            sample.reward, sample.score = float(reward), float(score)
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


def _check_labels(function: Any, source: str, config: PPOConfig, hint: str = "") -> None:
    """A term that declares ``needs_labels`` would score every sample against a missing label."""
    if getattr(function, "needs_labels", False) and not config.data.label_key:
        raise ConfigError(f"{source} compares responses with each prompt's label, but --data.label_key is not set: "
                          f"name the dataset key that holds the labels{hint}")
