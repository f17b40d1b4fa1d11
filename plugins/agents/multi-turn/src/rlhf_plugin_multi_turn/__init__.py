"""Multi-turn agent executor: OpenRLHF's agent-file contract over the rollout engines
(the episodes are run by :class:`rlhf_agents.episodes.EnvironmentExecutor`).

``--train.agent_func_path env.py`` (which selects ``--train.agent_executor multi_turn``) loads
``env.py``'s ``AgentInstance(rlhf_agents.AgentInstanceBase)`` — or an ``AgentExecutor(AgentExecutorBase)``
— and runs one episode per rollout sample, every episode of the batch concurrently on one event
loop in the controller; the turns of all episodes are batched into engine calls.

Token-in-token-out: the trajectory is the prompt's token ids, then each turn's sampled ids
(action mask 1, the engine's log-probs kept for IS correction) and the tokenised environment
feedback (action mask 0, never trained on). ``--data.max_len`` bounds the whole trajectory and
``--rollout.max_new_tokens`` each turn (a step's ``sampling_params`` may change it); an
episode cut by the budget ends with finish_reason ``length``. The episode's reward is the sum
of its step rewards, its score the last step's ``scores`` (default: the rewards): both feed
advantages, DAPO dynamic filtering and eval pass@k. An environment that raises, takes longer
than ``--multi_turn.step_timeout_s`` or answers a malformed dict fails its episode; the reward
stage applies ``--reward.on_error`` (``raise``: an error naming the agent file; ``zero`` /
``skip-sample``: counted in ``reward_failures/agent``).
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_agent_executors(register):
    register("multi_turn", "rlhf_plugin_multi_turn.executor:MultiTurnExecutor",
             description="OpenRLHF AgentInstance/AgentExecutor environments, many episodes at once")


@rlhf.hookimpl
def rlhf_register_options(register):
    register("rlhf_agents.episodes:EpisodeOptions", namespace="multi_turn")
