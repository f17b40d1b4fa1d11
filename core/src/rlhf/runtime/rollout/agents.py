"""From prompts to samples through the selected agent executor (``--train.agent_executor``).

Runs in the controller, once per generated batch. An executor's result per request holds
``response_ids``, ``logprobs`` and ``finish_reason``, and optionally ``action_mask`` (one 0/1
per response token: 0 for environment feedback), ``prompt_ids``/``prompt`` (when the
environment's reset changed the first observation) and ``agent`` (the environment's
``reward``, ``score``, ``extra_logs``, ``columns`` for the sample table, or an ``error`` in words) for executors that reward
their own episodes, and ``media`` (the images of the whole trajectory when an environment added
some, see :func:`rlhf.run_context.run_processor`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rlhf.errors import RewardSourceError
from rlhf.payloads import GenerationRequest
from rlhf.runtime.workers.batch import Sample

if TYPE_CHECKING:
    from rlhf.config.ppo import PPOConfig


def generate_samples(config: PPOConfig, executor: Any, engines: Any, tokenizer: Any, prompts: list[dict[str, Any]], n: int,
                     temperature: float, seed_base: int) -> list[Sample]:
    """``n`` samples per prompt, adjacent, each with its group index."""
    requests: list[GenerationRequest] = []
    for group, prompt in enumerate(prompts):
        room = config.data.max_len - len(prompt["prompt_ids"])
        max_tokens = max(1, min(config.rollout.max_new_tokens or room, room))
        for j in range(n):
            seed = (seed_base * 1_000_003 + group * 1009 + j) % (2**31 - 1)
            requests.append({"prompt_ids": prompt["prompt_ids"], "label": prompt["label"], "max_tokens": max_tokens,
                             "seed": seed, "group": group, "prompt": prompt["prompt"], "media": prompt.get("media"),
                             "fields": prompt.get("fields") or {}, "messages": prompt.get("messages")})
    results = executor.run(requests, engines, {"temperature": temperature, "top_p": config.rollout.top_p})
    # OpenRLHF's contract: the response keeps its special tokens (e.g. the EOS), so a
    # reward function sees query[len(prompt):] exactly as the model wrote it
    texts = tokenizer.batch_decode([r["response_ids"] for r in results], skip_special_tokens=False)
    return [Sample(prompt_ids=result.get("prompt_ids", request["prompt_ids"]), response_ids=result["response_ids"],
                   rollout_logprobs=result["logprobs"], prompt=result.get("prompt", request["prompt"]), response=text,
                   label=request["label"] if request["label"] is not None else "", fields=request["fields"],
                   group=request["group"],
                   finish_reason=result["finish_reason"], action_mask=result.get("action_mask"), agent=result.get("agent"),
                   media=result.get("media", request["media"]), data_state=prompts[request["group"]].get("data_state"),
                   token_records=result.get("token_records"))
            for request, result, text in zip(requests, results, texts)]


def agent_reward(queries: list[str], prompts: list[str], labels: list[Any], agents: list[dict[str, Any] | None],
                 **_: Any) -> dict[str, Any]:
    """The reward term of executors that reward their own episodes: the environments' results.

    A failed episode (its environment raised, timed out or answered a malformed dict) raises
    here, so the reward stage applies ``--reward.on_error`` to it and counts it in
    ``reward_failures/agent`` like any failing reward term.
    """
    for agent in agents:
        if agent is None:
            raise RewardSourceError("the agent executor returned no environment result for an episode")
        if agent.get("error"):
            raise RewardSourceError(agent["error"])
    logs: dict[str, list[float]] = {}
    columns: dict[str, list[Any]] = {}
    for i, agent in enumerate(agents):
        for key, value in (agent.get("extra_logs") or {}).items():
            logs.setdefault(key, []).append(float(value))
        for key, value in (agent.get("columns") or {}).items():  # an episode's own value: one per column
            columns.setdefault(key, [None] * len(agents))[i] = value
    return {"rewards": [float(a["reward"]) for a in agents], "scores": [float(a.get("score", a["reward"])) for a in agents],
            "extra_logs": {key: sum(values) / len(values) for key, values in logs.items()}, "columns": columns}
