"""OpenAI-compatible agent server executor: train any OpenAI-SDK agent, token-in-token-out.

``--train.agent_executor openai_server --train.agent_func_path agent.py``: ``agent.py`` defines
``AgentExecutor(OpenAIServerAgent)`` overriding ``async run_agent(prompt, label, session_id)
-> {"reward", "scores"?, "extra_logs"?, "columns"?}``. For every rollout batch the executor starts a FastAPI
server on 127.0.0.1 (a free port) whose ``/v1/chat/completions`` and ``/v1/completions`` (plus
``/v1/models``, ``/health``, ``/tokenize``) are backed by the rollout engines, then runs one
``run_agent`` per sample, all at once. The agent talks to ``self.base_url`` with any OpenAI
client, passing ``extra_body={"session_id": session_id}`` or the ``X-Session-ID`` header; ``stream=True`` is
answered as server-sent events (the turn's whole text in one chunk).

Every call of a session is recorded: its prompt must extend the session's text so far (the
previous prompt and completions, as the server returned them); only the new part is tokenised
(action mask 0) and the completion's token ids and log-probs are kept as sampled (mask 1), so
the session becomes one token trajectory, never re-tokenised. A prompt that does not extend
its session, an agent that raises, returns no ``reward`` or runs past
``--openai_server.episode_timeout_s`` fails its episode under ``--reward.on_error``.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


class OpenAIServerAgent:
    """Base of the agent file's ``AgentExecutor``: one instance per episode, with ``base_url``
    (``http://127.0.0.1:PORT/v1``) and ``model_name`` set before ``run_agent`` is awaited on the
    executor's event loop in the controller."""

    base_url: str = ""
    model_name: str = "rlhf-policy"

    async def run_agent(self, prompt, label, session_id):
        raise NotImplementedError("override run_agent(prompt, label, session_id) -> {'reward': ...}")


@rlhf.hookimpl
def rlhf_register_agent_executors(register):
    register("openai_server", "rlhf_plugin_openai_server.executor:OpenAIServerExecutor",
             description="local OpenAI-compatible server over the engines; any OpenAI-SDK agent")


@rlhf.hookimpl
def rlhf_register_options(register):
    register("rlhf_plugin_openai_server.executor:OpenAIServerOptions", namespace="openai_server")
