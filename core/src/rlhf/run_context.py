"""What a component running inside an RL run can ask the core for, beyond its ``from_config`` config.

Public (docs/plugin-api.md). Agent executors (the ``rlhf-agents`` library) use it for the run's
prompt processor; the policy's tokenizer is ``rlhf.models.loading.load_tokenizer(config.actor.model_name_or_path)``
and the length budget is ``config.data.max_len`` (prompt and response together) with
``config.rollout.max_new_tokens`` per generation.
"""

from __future__ import annotations

from typing import Any

from rlhf.data.prompts import prompt_processor
from rlhf.host.plugin_host import PluginHost
from rlhf.host.selection import PluginSelection

__all__ = ["run_processor"]


# config: Any (a PPOConfig) because the signature is public and snapshot-tested in plugin API 3: a typed one is a
# changed signature, which waits for the next API bump
def run_processor(config: Any) -> Any:
    """The run's prompt processor (a VLM plugin's, whose optional ``extend`` adds environment images to a
    trajectory; see :class:`rlhf.components.Processor`), or None for a text-only run. ``config`` is the run's
    validated ``rlhf train ppo`` config. Loads the run's plugin set once more, as the workers do.
    Runs in the controller, once per run, when an executor first needs it."""
    return prompt_processor(config, PluginHost.load(PluginSelection.from_resolved(config.plugin_set)).registry)
