"""Episodes of an environment over the rollout engines: the agent executor behind multi-turn RL.

:class:`EnvironmentExecutor` runs one episode per rollout sample, every episode of a batch concurrently
on one event loop in the controller, with the turns of all episodes batched into engine calls. The
environment is an ``AgentInstanceBase`` (``reset``/``step``, driven turn by turn) or an
``AgentExecutorBase`` (a whole episode written by its author against a vLLM-shaped engine).

Token-in-token-out: the trajectory is the prompt's token ids, then each turn's sampled ids (action
mask 1, the engine's log-probs kept for IS correction) and the tokenised environment feedback (action
mask 0, never trained on). ``--data.max_len`` bounds the whole trajectory and ``--rollout.max_new_tokens``
each turn (a step's ``sampling_params`` may change it); an episode cut by the budget ends with
finish_reason ``length``, one the environment ended (``done``) with ``stop``, even where its last turn used the
whole turn budget (a won game is not a truncated response for the overlong and stop-properly penalties). The
episode's reward is the sum of its step rewards, its score the last
step's ``scores`` (default: the rewards). An environment that raises, takes longer than
``step_timeout_s`` or answers a malformed dict fails its episode, and the reward stage applies
``--reward.on_error``.

rlhf-plugin-multi-turn runs environments from ``--train.agent_func_path`` files with it; a plugin
that ships its own environment subclasses it (``rlhf plugin new agent-environment NAME`` writes one).
"""

from __future__ import annotations

import asyncio
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from rlhf.errors import ConfigError
from rlhf.run_context import run_processor
from rlhf_agents import AgentExecutorBase, AgentInstanceBase
from rlhf_agents.chat_turns import ChatTemplateError, chat_feedback, chat_opening
from rlhf_agents.executors import AsyncAgentExecutor, UnsupportedSampling, turn_sampling


class EpisodeOptions(BaseModel):
    """The options every environment run takes (``--<namespace>.step_timeout_s``). An environment with options of
    its own subclasses it and names the subclass in its class attribute ``Options``: ``for_run`` validates the
    plugin's options with it and each episode's instance is built as ``environment(options)``."""

    model_config = ConfigDict(extra="forbid")

    step_timeout_s: float = Field(60.0, gt=0, description="most seconds one reset/step (or a whole AgentExecutor "
                                                           "episode) may take; past it the episode fails")


def _options_model(agent_class: type) -> type[EpisodeOptions]:
    """The environment's ``Options``, which must extend :class:`EpisodeOptions` (the step timeout is every run's)."""
    model = getattr(agent_class, "Options", None) or EpisodeOptions
    if not (isinstance(model, type) and issubclass(model, EpisodeOptions)):
        raise TypeError(f"{agent_class.__name__}.Options must subclass rlhf_agents.episodes.EpisodeOptions")
    return model


class EpisodeError(Exception):
    """The environment failed: raised, timed out or answered a malformed dict (the message says which)."""


@dataclass
class Trajectory:
    """One episode's response: model tokens (mask 1, engine log-probs) and feedback tokens (mask 0, log-prob 0)."""

    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    action_mask: list[int] = field(default_factory=list)

    def add(self, ids: list[int], logprobs: list[float] | None, is_action: bool) -> None:
        self.response_ids += ids
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        self.action_mask += [int(is_action)] * len(ids)


class EnvironmentExecutor(AsyncAgentExecutor):
    """Runs every episode of a rollout batch concurrently on one event loop (``run`` runs in the
    controller once per rollout batch); turns are batched into engine calls by :class:`EngineClient`.
    Its episodes reward themselves (``provides_rewards``): the reward term ``agent``."""

    def __init__(self, agent_class: type, tokenizer_path: str, max_len: int, max_new_tokens: int | None,
                 options: EpisodeOptions, media_processor: Callable[[], Any] | None = None, *,
                 source: str = "the environment", options_flag: str = "step_timeout_s") -> None:
        """``agent_class``: an ``AgentInstanceBase`` or ``AgentExecutorBase`` subclass, built once per episode.
        ``media_processor``: returns the run's prompt processor (a VLM's, or None), called once, the first time
        an environment returns ``environment_images``. ``source`` starts a failed episode's message (the agent
        file, the plugin); ``options_flag`` is where the user sets ``step_timeout_s``."""
        if not (isinstance(agent_class, type) and issubclass(agent_class, (AgentInstanceBase, AgentExecutorBase))):
            raise TypeError(f"{agent_class!r} must subclass rlhf_agents.AgentInstanceBase or AgentExecutorBase")
        super().__init__(tokenizer_path)
        self.agent_class, self.options, self.source, self.options_flag = agent_class, options, source, options_flag
        self.max_len, self.max_new_tokens = max_len, max_new_tokens
        self._media_processor, self._processor = media_processor, None
        self.template_kwargs: dict[str, Any] = {}  # the run's --data.chat_template_kwargs, for chat turns

    @classmethod
    def for_run(cls, agent_class: type, config: Any, *, source: str, namespace: str) -> Any:
        """The executor of an ``rlhf train ppo`` run (``config``): the policy's tokenizer, ``--data.max_len``,
        ``--rollout.max_new_tokens``, and the plugin options under ``namespace``, validated by the environment's
        ``Options`` (an :class:`EpisodeOptions` subclass; :class:`EpisodeOptions` itself where it has none)."""
        from pydantic import ValidationError

        model = _options_model(agent_class)
        try:
            options = model.model_validate(config.plugins.get(namespace, {}))
        except ValidationError as exc:
            problems = "; ".join(f"--{namespace}.{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise ConfigError(f"{source}: {problems} (the options {model.__name__} takes: "
                              f"{', '.join(model.model_fields)})") from None
        executor = cls(agent_class, config.actor.model_name_or_path, config.data.max_len, config.rollout.max_new_tokens,
                       options, functools.partial(run_processor, config), source=source,
                       options_flag=f"--{namespace}.step_timeout_s")
        executor.template_kwargs = dict(config.data.chat_template_kwargs or {})
        return executor

    def _environment(self) -> Any:
        """A fresh environment for one episode: built with the run's options where its class declares ``Options``."""
        return self.agent_class(self.options) if getattr(self.agent_class, "Options", None) is not None else self.agent_class()

    def _feedback_with_images(self, media: dict[str, Any] | None, feedback: str, images: Any) -> tuple[list[int], Any]:
        """The feedback's ids and the trajectory's media with ``images`` added, by the VLM plugin's processor."""
        if self._processor is None and self._media_processor is not None:
            self._processor = self._media_processor()
        if not callable(getattr(self._processor, "extend", None)):
            raise EpisodeError("AgentInstance.step returned environment_images, but the policy has no image processor "
                               "(a VLM policy with --data.image_key and the VLM plugin reads them)")
        try:
            out = self._processor.extend(media, feedback, list(images))
        except Exception as exc:  # noqa: BLE001 - an unreadable image is the environment's failure
            raise EpisodeError(f"AgentInstance.step: environment_images: {exc}") from exc
        return out["ids"], out["media"]

    async def run_async(self, requests: list[dict[str, Any]], engines: Any, sampling: dict[str, float]) -> list[dict[str, Any]]:
        from rlhf_agents.executors import EngineClient

        client = EngineClient(engines, sampling, self.max_len)
        episode = self._executor_episode if issubclass(self.agent_class, AgentExecutorBase) else self._instance_episode
        return list(await asyncio.gather(*(episode(request, client, sampling) for request in requests)))

    # ------------------------------------------------------------ AgentInstance

    async def _call(self, what: str, coroutine: Any) -> Any:
        try:
            return await asyncio.wait_for(coroutine, self.options.step_timeout_s)
        except asyncio.TimeoutError:
            raise EpisodeError(f"{what} took more than {self.options.step_timeout_s:g} s ({self.options_flag})") from None
        except Exception as exc:  # noqa: BLE001 - the environment's own failure, handled by --reward.on_error
            raise EpisodeError(f"{what} raised {type(exc).__name__}: {exc}") from exc

    def _failed(self, trajectory: Trajectory, prompt: dict[str, Any], reason: str) -> dict[str, Any]:
        return {**prompt, "response_ids": trajectory.response_ids, "logprobs": trajectory.logprobs,
                "action_mask": trajectory.action_mask, "finish_reason": "stop",
                "agent": {"error": f"{self.source}: {reason}"}}

    async def _instance_episode(self, request: dict[str, Any], client: Any, sampling: dict[str, float]) -> dict[str, Any]:
        """OpenRLHF's MultiTurnAgentExecutor loop: generate from token ids, step, append the feedback tokens."""
        instance = self._environment()
        trajectory, prompt = Trajectory(), {}
        # the conversation so far, where the run templates its prompts as chat (--data.apply_chat_template)
        conversation = [dict(m) for m in request["messages"]] if request.get("messages") else None
        try:
            reset = await self._call("AgentInstance.reset", instance.reset({
                "observation": request["prompt"], "label": request["label"], "fields": request.get("fields", {}),
                "messages": [dict(m) for m in conversation] if conversation is not None else None}))
            if isinstance(reset, dict) and reset.get("messages") is not None:  # the first turns, as chat messages
                conversation = _messages(reset["messages"], "AgentInstance.reset: messages")
                observation = _templated(chat_opening, self.tokenizer, conversation, self.template_kwargs)
            else:
                observation = reset.get("observation") if isinstance(reset, dict) else None
            if not isinstance(observation, str):
                raise EpisodeError(f"AgentInstance.reset returned {reset!r:.120} instead of a dict with an 'observation' "
                                   "string or 'messages'")
            if observation != request["prompt"]:  # the environment rewrote the first observation: tokenise it once
                ids = self.tokenizer(observation, add_special_tokens=False)["input_ids"]
                prompt = {"prompt": observation, "prompt_ids": ids[-(self.max_len - 1):]}  # room for one token at least
            tokens = list(prompt.get("prompt_ids", request["prompt_ids"]))
            media = request.get("media")
            text, params = observation, {"max_tokens": self.max_new_tokens, **sampling}
            reward, score, logs, columns, turn, finish = 0.0, None, {}, {}, 0, "stop"
            while True:
                room = self.max_len - len(tokens)
                if room <= 0:
                    finish = "length"
                    break
                max_tokens = min(params.get("max_tokens") or room, room)
                out = await client.generate_multimodal(tokens, media, max_tokens, request["seed"] + 7919 * turn,
                                                       params.get("temperature"), params.get("top_p"))
                turn += 1
                tokens += out["response_ids"]
                trajectory.add(out["response_ids"], out["logprobs"], is_action=True)
                finish = out["finish_reason"]
                action = self.tokenizer.decode(out["response_ids"], skip_special_tokens=True)
                if conversation is not None:
                    conversation.append({"role": "assistant", "content": action})
                states = {"observation_text": text, "action_text": action, "label": request["label"],
                          "fields": request.get("fields", {}), "sampling_params": params,
                          "messages": [dict(m) for m in conversation] if conversation is not None else None}
                result = await self._call("AgentInstance.step", instance.step(states))
                step_reward, step_score, feedback, done = _read_step(result)
                said = result.get("environment_messages")
                reward += step_reward
                score = step_score if step_score is not None else step_reward
                logs.update(result.get("extra_logs") or {})
                columns.update(result.get("columns") or {})  # the sample table's columns: the last step's value wins
                if result.get("sampling_params") is not None:
                    try:
                        params = {**params, **turn_sampling(result["sampling_params"], "AgentInstance.step")}
                    except UnsupportedSampling as exc:
                        raise EpisodeError(str(exc)) from None
                if done:  # the environment ended it (a won game): not cut, whatever the last turn's own finish
                    finish = "stop"
                    break
                if said is not None:  # chat turns: templated after the model's own, token-exact
                    said = _messages(said, "AgentInstance.step: environment_messages")
                    feedback, feedback_ids = _templated(chat_feedback, self.tokenizer, said, out["response_ids"],
                                                        out["finish_reason"], None, self.template_kwargs)
                    conversation = [*(conversation or []), *said]
                text += action + feedback
                room = self.max_len - len(tokens)
                if said is None and result.get("environment_images"):
                    feedback_ids, grown = self._feedback_with_images(media, feedback, result["environment_images"])
                    if len(feedback_ids) >= room:  # images are not cut: the episode ends before them
                        finish = "length"
                        break
                    media = prompt["media"] = grown
                elif said is None:
                    feedback_ids = self.tokenizer(feedback, add_special_tokens=False)["input_ids"] if feedback else []
                if len(feedback_ids) >= room:  # the feedback would leave no room for another turn: truncate
                    trajectory.add(feedback_ids[:room], None, is_action=False)
                    finish = "length"
                    break
                tokens += feedback_ids
                trajectory.add(feedback_ids, None, is_action=False)
        except EpisodeError as exc:
            return self._failed(trajectory, prompt, str(exc))
        return {**prompt, "response_ids": trajectory.response_ids, "logprobs": trajectory.logprobs,
                "action_mask": trajectory.action_mask, "finish_reason": finish,
                "agent": {"reward": reward, "score": score, "extra_logs": _scalars(logs), "columns": columns, "turns": turn}}

    # ------------------------------------------------------------ AgentExecutor

    async def _executor_episode(self, request: dict[str, Any], client: Any, sampling: dict[str, float]) -> dict[str, Any]:
        """A user-written episode; its ``observation_tokens`` and ``action_ranges`` become the sample."""
        from rlhf_agents.executors import VLLMStyleEngine

        engine = VLLMStyleEngine(client, request["max_tokens"], request["seed"])
        engine.media = request.get("media")
        params = {"max_tokens": request["max_tokens"], **sampling}
        try:
            out = await self._call("AgentExecutor.execute", self._environment().execute(
                request["prompt"], request["label"], params, self.max_len, self.tokenizer, engine,
                images=_prompt_images(engine.media)))
            return {**_from_executor_output(out, len(request["prompt_ids"]), request["prompt_ids"]),
                    "agent": _executor_reward(out)}
        except EpisodeError as exc:
            return self._failed(Trajectory(), {}, str(exc))


def _prompt_images(media: dict[str, Any] | None) -> list[Any] | None:
    """The prompt's images as PIL images (OpenRLHF's ``images`` argument of ``execute``), or None."""
    if not media or not media.get("images"):
        return None
    import io

    from PIL import Image

    return [Image.open(io.BytesIO(data)).convert("RGB") for data in media["images"]]


def _read_step(result: Any) -> tuple[float, float | None, str, bool]:
    """``(reward, score, feedback, done)`` of a step's dict; an :class:`EpisodeError` when it is malformed."""
    if not isinstance(result, dict):
        raise EpisodeError(f"AgentInstance.step returned {type(result).__name__}, not a dict")
    missing = [key for key in ("rewards", "done") if key not in result]
    if missing:
        raise EpisodeError(f"AgentInstance.step returned a dict without {', '.join(map(repr, missing))} "
                           f"(keys: {', '.join(map(str, result)) or 'none'})")
    feedback = result.get("environment_feedback") or ""
    if feedback and result.get("environment_messages") is not None:
        raise EpisodeError("AgentInstance.step returned both environment_feedback and environment_messages; "
                           "answer one (messages are templated as chat turns, feedback is appended as text)")
    if result.get("environment_messages") is not None and result.get("environment_images"):
        raise EpisodeError("AgentInstance.step returned environment_images with environment_messages; images come with "
                           "environment_feedback text (the VLM processor places them), chat messages without images")
    if not isinstance(feedback, str):
        raise EpisodeError(f"AgentInstance.step: environment_feedback is a {type(feedback).__name__}, not text")
    reward = _number(result["rewards"], "rewards")
    score = _number(result["scores"], "scores") if result.get("scores") is not None else None
    return reward, score, feedback, bool(result["done"])


def _templated(render: Callable[..., Any], *args: Any) -> Any:
    """``render(*args)``, its chat template's refusal an :class:`EpisodeError` (the environment's turns failed)."""
    try:
        return render(*args)
    except ChatTemplateError as exc:
        raise EpisodeError(str(exc)) from None


def _messages(value: Any, what: str) -> list[dict[str, Any]]:
    """Chat messages as an environment answered them: a list of dicts, each with a string ``role``."""
    if not isinstance(value, list) or not all(isinstance(m, dict) and isinstance(m.get("role"), str) for m in value):
        raise EpisodeError(f"{what} must be a list of {{'role': ..., 'content': ...}} dicts, not {value!r:.120}")
    return [dict(m) for m in value]


def _number(value: Any, what: str) -> float:
    try:
        number = float(value.item() if hasattr(value, "item") else value)
    except (TypeError, ValueError, RuntimeError):
        raise EpisodeError(f"AgentInstance.step: {what} {value!r:.80} is not a number") from None
    if not math.isfinite(number):
        raise EpisodeError(f"AgentInstance.step: {what} is {number}")
    return number


def _scalars(logs: dict[str, Any]) -> dict[str, float]:
    return {key: float(value.item() if hasattr(value, "item") else value) for key, value in logs.items()}


def _from_executor_output(out: Any, prompt_len: int, prompt_ids: list[int]) -> dict[str, Any]:
    """An ``AgentExecutor``'s dict as a response: the tokens after the prompt, masked by ``action_ranges``."""
    if not isinstance(out, dict) or "observation_tokens" not in out or "action_ranges" not in out:
        raise EpisodeError("AgentExecutor.execute must return a dict with observation_tokens and action_ranges")
    tokens = list(out["observation_tokens"])
    if tokens[:prompt_len] != list(prompt_ids):
        raise EpisodeError("AgentExecutor.execute: observation_tokens must start with the prompt's token ids")
    mask = [0] * len(tokens)
    for start, end in out["action_ranges"]:
        mask[start:end] = [1] * (end - start)
    logprobs = out.get("rollout_log_probs") or [0.0] * len(tokens)
    return {"response_ids": tokens[prompt_len:], "logprobs": [float(x) for x in logprobs[prompt_len:len(tokens)]],
            "action_mask": mask[prompt_len:], "finish_reason": "length" if out.get("truncated") else "stop"}


def _executor_reward(out: dict[str, Any]) -> dict[str, Any]:
    if "reward" not in out and "rewards" not in out:
        raise EpisodeError("AgentExecutor.execute returned a dict without 'reward'")
    reward = _number(out.get("reward", out.get("rewards")), "reward")
    score = _number(out["scores"], "scores") if out.get("scores") is not None else reward
    return {"reward": reward, "score": score, "extra_logs": _scalars(out.get("extra_logs") or {}),
            "columns": dict(out.get("columns") or {})}
