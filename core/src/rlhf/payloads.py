"""The records that cross process boundaries in an RL step, as typed dicts.

They stay plain dicts at run time (cheap to pickle through Ray, easy to build in a plugin), and these
types say which keys each one holds, with which shapes. Public: rollout engines and agent executors
receive and return them (docs/plugin-api.md).
"""

from __future__ import annotations

from typing import Any, Literal, TypedDict

from typing_extensions import NotRequired

__all__ = ["GenerationRequest", "GenerationResult", "AgentOutcome", "WorkerColumns"]


class GenerationRequest(TypedDict):
    """One sample to generate. Built by the controller, once per sample of a generation batch; an agent
    executor passes on its own requests (one per model turn) to the rollout engines."""

    prompt_ids: list[int]  # the prompt, tokenised; never re-tokenised downstream
    max_tokens: int  # at most this many response tokens
    seed: int  # the sample's own seed: the same request gives the same sample
    prompt: NotRequired[str]  # the prompt's text (agent executors; engines ignore it)
    label: NotRequired[Any]  # the dataset's label for the reward (agent executors; engines ignore it)
    fields: NotRequired[dict[str, Any]]  # the row's other fields (agent executors; engines ignore it)
    messages: NotRequired[list[dict[str, Any]] | None]  # the prompt as chat messages, where the run templates it as chat
    group: NotRequired[int]  # the prompt's index in its rollout batch (samples of one prompt share it)
    media: NotRequired[dict[str, Any] | None]  # a VLM prompt's images (see rlhf.media.collate_media)


class AgentOutcome(TypedDict, total=False):
    """What an environment said of one episode, when the agent executor rewards its own episodes."""

    reward: float
    score: float
    extra_logs: dict[str, float]
    columns: dict[str, Any]  # the episode's own columns (text or numbers) for the sample table and --rollout.dump_dir
    error: str  # a failed episode: the rest is absent


class GenerationResult(TypedDict):
    """One generated sample, in request order. Returned by a rollout engine (the first three keys) or an
    agent executor (any of them)."""

    response_ids: list[int]  # at most max_tokens; a rollout engine gives at least one
    logprobs: list[float]  # one per response token, under the distribution actually sampled
    finish_reason: Literal["stop", "length"]  # "stop" at EOS
    action_mask: NotRequired[list[int]]  # one 0/1 per response token; 0: environment tokens, never trained on
    prompt_ids: NotRequired[list[int]]  # the first observation, when the environment replaced the prompt
    prompt: NotRequired[str]
    agent: NotRequired[AgentOutcome]
    media: NotRequired[dict[str, Any] | None]  # the trajectory's images: the prompt's, then the environment's
    # what model extensions recorded while the engine generated it (rlhf.models.extensions.recording), by name: one
    # array each whose first axis is the sequence's positions (prompt then response) the engine forwarded
    token_records: NotRequired[dict[str, Any]]


class WorkerColumns(TypedDict):
    """The columns the controller sends to every model worker for a batch of samples (split by rank)."""

    prompt_ids: list[list[int]]
    response_ids: list[list[int]]
    media: NotRequired[list[dict[str, Any] | None]]  # VLM runs only
    action_masks: NotRequired[list[list[int] | None]]  # multi-turn runs only
    token_records: NotRequired[list[dict[str, Any] | None]]  # the engine's per-position records (GenerationResult)
