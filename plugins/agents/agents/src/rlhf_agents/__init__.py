"""OpenRLHF's agent-file base classes, so an OpenRLHF agent file runs with one changed import line::

    from openrlhf.utils.agent import AgentInstanceBase   # OpenRLHF
    from rlhf_agents import AgentInstanceBase            # rlhf

An agent file given with ``--train.agent_func_path`` defines either

* ``AgentInstance(AgentInstanceBase)``: one environment per episode, driven turn by turn by
  the ``multi_turn`` executor (the rlhf-plugin-multi-turn distribution), or
* ``AgentExecutor(AgentExecutorBase)``: a whole episode written by the user, against an
  ``llm_engine`` whose ``generate`` behaves like vLLM's (token ids in, a ``RequestOutput``-shaped
  object out).

Both classes are built with no arguments. Their coroutines run on the executor's event
loop in the controller process, many episodes at once; a coroutine that blocks (``time.sleep``,
a synchronous HTTP call) stalls every episode, so wrap blocking work in ``asyncio.to_thread``.
"""

from __future__ import annotations

import importlib.util
import sys
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from rlhf.errors import ConfigError


class AgentInstanceBase(ABC):
    """One environment episode (a fresh instance per episode).

    Built with no argument, or, where the class declares ``Options`` (an ``rlhf_agents.episodes.EpisodeOptions``
    subclass of its own fields), with the run's options validated by it: ``Environment(options)``.

    ``reset(states)`` runs once, ``states = {"observation": prompt text, "label": label, "fields": the prompt row's
    other fields, "messages": the prompt as chat messages (with ``--data.apply_chat_template``; else None)}``, and
    returns ``{"observation": text}`` (the text the model is first prompted with; the prompt itself when
    unchanged) or ``{"messages": [...]}`` (the first turns as chat, templated for generation). ``step(states)`` runs
    after every model turn with ``states = {"observation_text": everything so far, "action_text": the model's last
    turn, "label": label, "fields": dict, "sampling_params": dict, "messages": the conversation so far, the model's
    turn last (None without chat)}``
    and returns a dict with ``rewards`` (a number or one-element tensor; the episode's reward is the
    sum over steps), ``environment_feedback`` (text appended to the trajectory, never trained on) or
    ``environment_messages`` (chat messages, e.g. a user turn or a tool result, rendered by the policy's chat template
    after the model's turn, token-exact: :mod:`rlhf_agents.chat_turns`),
    ``done`` (bool), and optionally ``scores`` (for dynamic filtering and pass@k; the last step's
    count, default the rewards), ``extra_logs`` (name -> number, logged as means), ``columns`` (name -> text or
    number: the episode's own columns in the sample table and ``--rollout.dump_dir``, the last step's value kept) and
    ``sampling_params`` (``max_tokens``, ``temperature``, ``top_p`` for the next turn; another key the
    engines cannot apply, e.g. ``stop``, fails the episode naming it), ``environment_images`` (images
    the feedback refers to, for a VLM policy: see docs/agents.md).
    """

    @abstractmethod
    async def reset(self, states: dict[str, Any]) -> dict[str, Any]: ...

    @abstractmethod
    async def step(self, states: dict[str, Any]) -> dict[str, Any]: ...


class AgentExecutorBase(ABC):
    """A whole episode written by the user.

    ``execute`` runs once per episode and returns ``observation_tokens`` (prompt and trajectory
    token ids), ``action_ranges`` (``(start, end)`` spans of model tokens in ``observation_tokens``),
    ``rollout_log_probs`` (one per token of ``observation_tokens``, or None), ``truncated`` (bool),
    ``reward``, and optionally ``scores``, ``extra_logs`` and ``columns`` (as a step's). ``llm_engine.generate(prompt_token_ids,
    sampling_params)`` is awaited for each model turn and returns an object with
    ``outputs[0].token_ids``, ``outputs[0].logprobs`` (a list of ``{token_id: obj with .logprob}``)
    and ``outputs[0].finish_reason``; ``sampling_params`` is a dict or an object with
    ``max_tokens``, ``temperature``, ``top_p`` attributes.
    """

    @abstractmethod
    async def execute(self, prompt: str, label: Any, sampling_params: Any, max_length: int, hf_tokenizer: Any,
                      llm_engine: Any, images: Any = None) -> dict[str, Any]: ...


def load_agent_class(path: str, names: tuple[str, ...], flag: str = "--train.agent_func_path") -> type:
    """Import the agent file at ``path`` and return the first class of ``names`` it defines.

    Raises :class:`rlhf.errors.ConfigError` naming the file when it is missing, fails to import
    or defines none of ``names``.
    """

    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"{flag} {path}: no such file; give the .py file that defines {' or '.join(names)}")
    spec = importlib.util.spec_from_file_location(f"rlhf_agent_file_{file.stem}", file)
    assert spec is not None and spec.loader is not None, "spec_from_file_location accepts any .py path"
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # as an import would: dataclasses and pickling inside the file work
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[spec.name]
        raise ConfigError(f"{flag} {path} raised {type(exc).__name__} while being imported: {exc}; fix the file "
                          "(an OpenRLHF agent file needs `from rlhf_agents import ...` instead of openrlhf.utils.agent)") from exc
    for name in names:
        found = getattr(module, name, None)
        if isinstance(found, type):
            return found
    raise ConfigError(f"{flag} {path} defines no class {' or '.join(names)}; define one (see docs/agents.md)")


__all__ = ["AgentExecutorBase", "AgentInstanceBase", "load_agent_class"]
