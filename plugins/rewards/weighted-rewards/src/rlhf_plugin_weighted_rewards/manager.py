"""The ``weighted`` reward manager: every reward source of the run is one weighted term.

Terms, in order: the agent executor's own rewards (``agent``, when it gives them), the
``--reward.functions`` terms, the ``--reward.remote_url`` source (a ``reward_func`` .py file or
http(s) URLs), and one term per reward model (``reward_model``, or ``reward_model_<i>`` for
several). The environments' term weighs 1 unless ``--reward.functions`` names it
(``agent:0.8,format:0.2``), and its scores drive filtering and eval unless ``--reward.score_term``
names another term. Built once per run in the controller; called once per generated batch.
"""

from __future__ import annotations

from typing import Any

from rlhf.components import RewardBatch, RewardResult, RewardSources
from rlhf.errors import ConfigError
from rlhf_plugin_weighted_rewards.terms import CompositeReward, TermSpec, parse_terms

#: The reward term of an agent executor's environments (``--reward.functions agent:W`` weighs it).
AGENT_TERM = "agent"


class WeightedRewards:
    def __init__(self, sources: RewardSources) -> None:
        reward = sources.config.reward
        try:
            specs = parse_terms(reward.functions, reward.on_error)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        agent = sources.agent
        terms: list[tuple[TermSpec, Any]] = []
        if agent is not None and AGENT_TERM not in [spec.name for spec in specs]:
            terms.append((TermSpec(AGENT_TERM, 1.0, reward.on_error), agent))
        for spec in specs:
            source = agent if spec.name == AGENT_TERM and agent is not None else None
            terms.append((spec, source or sources.function(spec.name, "--reward.functions")))
        if reward.remote_url:
            terms.append((TermSpec(_remote_term(reward.remote_url), 1.0, reward.on_error),
                          sources.function(_remote_term(reward.remote_url), f"--reward.remote_url {reward.remote_url}")))
        for index, model in enumerate(sources.reward_models):
            name = "reward_model" if len(sources.reward_models) == 1 else f"reward_model_{index}"
            terms.append((TermSpec(name, 1.0, reward.on_error), model))
        if not terms:
            raise ConfigError("no reward source: set --reward.functions, --reward.remote_url (a reward_func .py file) "
                              "or --reward.model_name_or_path")
        try:
            self.composite = CompositeReward(terms, reward.score_term or (AGENT_TERM if agent is not None else None))
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def __call__(self, batch: RewardBatch) -> RewardResult:
        return self.composite(batch.queries, batch.prompts, batch.labels, **batch.columns)


def _remote_term(remote: str) -> str:
    """The reward function that serves ``--reward.remote_url``: a ``reward_func`` file or a reward server."""
    if remote.endswith(".py"):
        return "reward_func_file"
    if remote.startswith(("http://", "https://")):
        return "remote_http"
    raise ConfigError(f"--reward.remote_url {remote}: give a reward_func .py file or http(s) URL(s)")
