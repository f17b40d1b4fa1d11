"""The OpenAI-server executor (see the package docstring)."""

from __future__ import annotations

import asyncio
import math
import socket
import uuid
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from rlhf_agents import load_agent_class
from rlhf_agents.executors import AsyncAgentExecutor

from rlhf_plugin_openai_server.sessions import Session, build_app


class OpenAIServerOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    episode_timeout_s: float = Field(300.0, gt=0, description="most seconds one run_agent call may take")
    model_name: str = Field("rlhf-policy", description="the model id the server reports and accepts")
    tool_parser: Literal["hermes", "none"] = Field(
        "hermes", description="how a completion's text becomes tool calls when the request sends tools: hermes "
                              "(<tool_call> JSON blocks: Qwen, Hermes) or none (the text as written)")


class OpenAIServerExecutor(AsyncAgentExecutor):
    """Each rollout batch: start the server on 127.0.0.1 (a free port), run every episode's
    ``run_agent`` concurrently on the same event loop, stop the server. ``run`` runs in the
    controller once per rollout batch."""

    def __init__(self, agent_path: str, agent_class: type, tokenizer_path: str, max_len: int,
                 options: OpenAIServerOptions, template_kwargs: dict[str, Any] | None = None) -> None:
        super().__init__(tokenizer_path)
        self.agent_path, self.agent_class = agent_path, agent_class
        self.max_len, self.options = max_len, options
        self.template_kwargs = dict(template_kwargs or {})  # --data.chat_template_kwargs, for every chat render

    @classmethod
    def from_config(cls, config: Any) -> OpenAIServerExecutor:
        from rlhf.errors import ConfigError

        path = config.train.agent_func_path
        if not path:
            raise ConfigError("--train.agent_executor openai_server runs an agent file: set --train.agent_func_path "
                              "agent.py defining AgentExecutor(OpenAIServerAgent) (see docs/agents.md)")
        agent_class = load_agent_class(path, ("AgentExecutor",))
        if not callable(getattr(agent_class, "run_agent", None)):
            raise ConfigError(f"--train.agent_func_path {path}: AgentExecutor has no async run_agent(prompt, label, session_id)")
        options = OpenAIServerOptions.model_validate(config.plugins.get("openai_server", {}))
        return cls(path, agent_class, config.actor.model_name_or_path, config.data.max_len, options,
                   config.data.chat_template_kwargs)

    async def run_async(self, requests: list[dict[str, Any]], engines: Any, sampling: dict[str, float]) -> list[dict[str, Any]]:
        import uvicorn
        from rlhf_agents.executors import EngineClient

        state = _ServerState(self.tokenizer, EngineClient(engines, sampling, self.max_len), self.options.model_name,
                             self.options.tool_parser, self.template_kwargs)
        state.max_tokens = max((r["max_tokens"] for r in requests), default=1)
        seeds = {}
        with socket.socket() as probe:  # a free port, then handed to uvicorn (it binds right away)
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        server = uvicorn.Server(uvicorn.Config(build_app(state), host="127.0.0.1", port=port, log_level="warning",
                                               lifespan="off"))
        serving = asyncio.create_task(server.serve())
        while not server.started:
            if serving.done():
                serving.result()  # the bind failed: raise it
            await asyncio.sleep(0.01)
        base_url = f"http://127.0.0.1:{port}/v1"
        try:
            episodes = []
            for request in requests:
                session_id = uuid.uuid4().hex
                state.sessions[session_id] = Session()
                seeds[session_id] = request["seed"]
                episodes.append(self._episode(request, session_id, base_url, state))
            state.seed = lambda session_id, call: seeds[session_id] + 7919 * call
            return list(await asyncio.gather(*episodes))
        finally:
            server.should_exit = True
            await serving

    async def _episode(self, request: dict[str, Any], session_id: str, base_url: str, state: Any) -> dict[str, Any]:
        agent = self.agent_class()
        agent.base_url, agent.model_name = base_url, self.options.model_name
        session = state.sessions[session_id]
        error = None
        try:
            out = await asyncio.wait_for(agent.run_agent(request["prompt"], request["label"], session_id),
                                         self.options.episode_timeout_s)
            reward = _result(out)
        except asyncio.TimeoutError:
            error = f"run_agent took more than {self.options.episode_timeout_s:g} s (--openai_server.episode_timeout_s)"
        except Exception as exc:  # noqa: BLE001 - the agent's own failure, handled by --reward.on_error
            error = f"run_agent raised {type(exc).__name__}: {exc}"
        if error is None and session.error:
            error = f"session {session_id}: {session.error}"
        if error is None and session.calls == 0:
            error = "run_agent made no completion call with its session_id (pass extra_body={'session_id': session_id})"
        result = {"prompt_ids": session.prompt_ids or request["prompt_ids"], "prompt": session.prompt_text or request["prompt"],
                  "response_ids": session.response_ids, "logprobs": session.logprobs, "action_mask": session.action_mask,
                  "finish_reason": session.last_finish}
        result["agent"] = {"error": f"--train.agent_func_path {self.agent_path}: {error}"} if error else reward
        return result


class _ServerState:
    def __init__(self, tokenizer: Any, client: Any, model_name: str, tool_parser: str,
                 template_kwargs: dict[str, Any]) -> None:
        self.tokenizer, self.client, self.model_name, self.tool_parser = tokenizer, client, model_name, tool_parser
        self.template_kwargs = template_kwargs
        self.sessions: dict[str, Session] = {}
        self.max_tokens = 1
        self.seed: Any = None


def _result(out: Any) -> dict[str, Any]:
    if not isinstance(out, dict) or ("reward" not in out and "rewards" not in out):
        raise ValueError(f"run_agent must return a dict with 'reward' (got {out!r:.120})")
    reward = float(out.get("reward", out.get("rewards")))
    score = float(out["scores"]) if out.get("scores") is not None else reward
    if not (math.isfinite(reward) and math.isfinite(score)):
        raise ValueError(f"run_agent returned a non-finite reward {reward} / score {score}")
    logs = {key: float(value) for key, value in (out.get("extra_logs") or {}).items()}
    # columns: the episode's own text or numbers in the sample table and the rollout dump, as an environment's
    return {"reward": reward, "score": score, "extra_logs": logs, "columns": dict(out.get("columns") or {})}
