"""Post-processors of scored best-of-n samples: rejection sampling, iterative DPO, conditional SFT.

Pure functions on plain rows; they run in the ``rlhf generate`` CLI process, once per
run, after every sample was scored. A sample row is

    {"input": <raw dataset prompt value>, "output": <response text>, "reward": float, "prompt_index": int}

``input`` is the dataset value of ``--input_key`` *before* any template (a string or a
list of chat messages), so the trainer that consumes the output applies its own
``--data.input_template`` / ``--data.apply_chat_template`` to it exactly once. (OpenRLHF
wrote the templated prompt string instead; fed to our supervised trainers, whose default
``--data.input_template`` is ``"User: {}\\nAssistant: "``, that would be templated twice.)

Samples are grouped by ``prompt_index`` (by the input itself when a row has none), in
first-seen order; within a group ties go to the earliest sample, so the selection is
deterministic.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

#: OpenRLHF's conditional-SFT template (its rewards were written with 2 decimals).
DEFAULT_CSFT_TEMPLATE = "{input} <rm_score>: {reward:.2f} "

#: ``1e-8`` as in OpenRLHF's z-normalisation: ``(r - mean) / (std + eps)``, population std.
CSFT_EPS = 1e-8


def _rewards_of(rows: list[dict[str, Any]], name: str) -> list[float]:
    rewards = []
    for index, row in enumerate(rows):
        reward = row.get("reward")
        if reward is None:
            raise ValueError(f"post-processor {name}: sample {index} has no reward (score the samples with --reward_model)")
        rewards.append(float(reward))
    return rewards


def group_samples(rows: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    """The samples of each prompt, prompts in first-seen order, samples in their original order."""
    groups: dict[Any, list[dict[str, Any]]] = {}
    for row in rows:
        key = row["prompt_index"] if row.get("prompt_index") is not None else json.dumps(row["input"], sort_keys=True)
        groups.setdefault(key, []).append(row)
    return list(groups.values())


def rejection_sampling(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rs`` (Llama-2 style): per prompt the highest-reward response -> ``{input, output, reward}``.

    Train on it with ``rlhf train sft --data.input_key input --data.output_key output``.
    """
    _rewards_of(rows, "rs")
    out = []
    for samples in group_samples(rows):
        best = max(samples, key=lambda s: float(s["reward"]))  # max() keeps the first of equal rewards
        out.append({"input": best["input"], "output": best["output"], "reward": float(best["reward"])})
    return out


def iterative_dpo(rows: list[dict[str, Any]], drop_ties: bool = False) -> list[dict[str, Any]]:
    """``iter_dpo``: per prompt chosen = highest-reward, rejected = lowest-reward response.

    -> ``{prompt, chosen, rejected, chosen_reward, rejected_reward}``, for ``rlhf train dpo
    --data.prompt_key prompt``. A prompt whose responses all have the same reward (or that
    has a single response) yields chosen == rejected, a pair that carries no gradient; it
    is kept, as OpenRLHF did, unless ``drop_ties``.
    """
    _rewards_of(rows, "iter_dpo")
    out = []
    for samples in group_samples(rows):
        chosen = max(samples, key=lambda s: float(s["reward"]))
        rejected = min(samples, key=lambda s: float(s["reward"]))
        if drop_ties and float(chosen["reward"]) == float(rejected["reward"]):
            continue
        out.append({"prompt": chosen["input"], "chosen": chosen["output"], "rejected": rejected["output"],
                    "chosen_reward": float(chosen["reward"]), "rejected_reward": float(rejected["reward"])})
    return out


def z_normalize(rewards: list[float], eps: float = CSFT_EPS) -> list[float]:
    """``(r - mean) / (std + eps)`` over the whole list, population std (numpy's default, as OpenRLHF)."""
    if not rewards:
        return []
    mean = sum(rewards) / len(rewards)
    std = math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
    return [(r - mean) / (std + eps) for r in rewards]


def condition_input(value: Any, reward: float, template: str = DEFAULT_CSFT_TEMPLATE) -> Any:
    """The prompt value tagged with a reward: ``template.format(input=..., reward=reward)``.

    A string is rewritten as a whole; a list of chat messages gets its last user message
    rewritten (a copy; the other messages are kept), so a chat template still applies.
    Used for csft training rows and, with ``rlhf generate --csft_reward``, at sampling time.
    """
    if isinstance(value, list) and value and all(isinstance(m, dict) for m in value):
        messages = [dict(m) for m in value]
        users = [i for i, m in enumerate(messages) if m.get("role") == "user"]
        target = users[-1] if users else len(messages) - 1
        messages[target]["content"] = template.format(input=messages[target].get("content", ""), reward=reward)
        return messages
    return template.format(input=value if isinstance(value, str) else str(value), reward=reward)


def check_csft_template(template: str) -> None:
    """Raise ``ValueError`` when ``template`` lacks ``{input}``/``{reward}`` or does not format."""
    if "{input}" not in template or "{reward" not in template:
        raise ValueError(f"{template!r} must contain {{input}} and {{reward}} (e.g. {DEFAULT_CSFT_TEMPLATE!r})")
    try:
        template.format(input="x", reward=1.0)
    except (KeyError, IndexError, ValueError) as exc:
        raise ValueError(f"{template!r} does not format with input and reward: {exc}") from exc


def conditional_sft(rows: list[dict[str, Any]], template: str = DEFAULT_CSFT_TEMPLATE,
                    normalize: bool = False) -> list[dict[str, Any]]:
    """``csft`` (arXiv 2308.12050): every sample, its input tagged with its reward -> ``{input, output}``.

    ``normalize`` z-normalises the rewards over the whole set first (:func:`z_normalize`).
    The default template writes the reward with 2 decimals: ``"{input} <rm_score>: 0.53 "``.
    """
    check_csft_template(template)
    rewards = _rewards_of(rows, "csft")
    if normalize:
        rewards = z_normalize(rewards)
    return [{"input": condition_input(row["input"], reward, template), "output": row["output"]}
            for row, reward in zip(rows, rewards)]


def no_post_processing(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``none``: every sample as it is."""
    return rows


#: ``--post_processor`` name -> (function, needs rewards, least --best_of_n).
POST_PROCESSORS: dict[str, tuple[Callable[..., list[dict[str, Any]]], bool, int]] = {
    "none": (no_post_processing, False, 1),
    "rs": (rejection_sampling, True, 1),
    "iter_dpo": (iterative_dpo, True, 2),
    "csft": (conditional_sft, True, 1),
}
