"""Per-session token trajectories and the OpenAI-compatible HTTP app over the rollout engines.

No ``from __future__ import annotations`` here: FastAPI reads the handlers' annotations at run time."""

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from rlhf_plugin_openai_server.tool_calls import parse_tool_calls


class SessionError(Exception):
    """A request that cannot extend its session's trajectory (the message says why)."""


@dataclass
class Session:
    """One episode's trajectory: the first prompt's ids, then completions (mask 1) and what the
    agent added between calls (tool results, user turns: mask 0)."""

    prompt_ids: list[int] = field(default_factory=list)
    prompt_text: str = ""
    response_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    action_mask: list[int] = field(default_factory=list)
    text: str = ""  # prompt + response so far as the client sees it (what the next prompt must extend)
    #: the text of the stop token that ended the last completion (e.g. ``</s>``): the client never sees it,
    #: and when the chat template writes it after the assistant's reply it is already in the trajectory
    pending_stop: str = ""
    last_finish: str = "stop"
    last_turn_ids: list[int] = field(default_factory=list)  # the last completion's ids, as sampled
    #: the chat messages the session has been sent, the assistant's replies aside, as (role, content) pairs
    said: list[tuple[Any, Any]] = field(default_factory=list)
    opened: int = 0  # messages in the first call (its assistant messages, e.g. few-shot examples, are not replies)
    calls: int = 0
    error: str | None = None

    @property
    def tokens(self) -> list[int]:
        return self.prompt_ids + self.response_ids

    def extend_prompt(self, text: str, tokenizer: Any) -> list[int]:
        """The token ids of a new prompt ``text``, which must extend this session's text: only the new
        suffix is tokenised (mask 0), the trajectory so far is never re-tokenised."""
        if self.calls == 0:
            self.prompt_text, self.text = text, text
            self.prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
            return self.tokens
        if not text.startswith(self.text):
            raise SessionError("prefix stability: the new prompt does not extend the session's prompt and completions "
                               "(send the previous messages and the assistant's replies unchanged, or start a new session)")
        suffix = text[len(self.text):]
        if self.pending_stop and suffix.startswith(self.pending_stop):
            suffix = suffix[len(self.pending_stop):]
        self.pending_stop = ""
        ids = tokenizer(suffix, add_special_tokens=False)["input_ids"] if suffix else []
        self.add(ids, None, is_action=False, text=suffix)
        return self.tokens

    def extend_chat(self, messages: list[dict[str, Any]], tools: Any, tokenizer: Any,
                    template_kwargs: dict[str, Any]) -> list[int]:
        """The token ids of a chat request: the first renders the messages; a later one must hold every reply the
        session returned as an assistant message, after the same messages as before, and only the messages after
        the last reply are rendered, by the template's own text after an assistant turn (token-exact however the
        template would re-render the replies: Qwen3's think blocks, a tool call's JSON spacing)."""
        from rlhf_agents.chat_turns import ChatTemplateError, chat_feedback

        if self.calls == 0:
            self.said, self.opened = _sent(messages, len(messages)), len(messages)
            return self.extend_prompt(render_chat(tokenizer, messages, tools, template_kwargs), tokenizer)
        replies = [i for i, m in enumerate(messages) if i >= self.opened and m.get("role") == "assistant"]
        said = _sent(messages, self.opened)
        if len(replies) != self.calls:
            raise SessionError(f"prefix stability: the messages hold {len(replies)} assistant replies, the session "
                               f"returned {self.calls}; send each reply back as it came (or start a new session)")
        new = messages[replies[-1] + 1:]
        if said[:len(said) - len(new)] != self.said:
            raise SessionError("prefix stability: the messages before the last reply differ from those the session "
                               "was sent; send them unchanged (or start a new session)")
        try:
            text, ids = chat_feedback(tokenizer, new, self.last_turn_ids, self.last_finish, tools, template_kwargs)
        except ChatTemplateError as exc:
            raise SessionError(str(exc)) from None
        self.said = said
        self.add(ids, None, is_action=False, text=text)
        return self.tokens

    def add(self, ids: list[int], logprobs: list[float] | None, is_action: bool, text: str) -> None:
        self.response_ids += ids
        self.logprobs += logprobs if logprobs is not None else [0.0] * len(ids)
        self.action_mask += [int(is_action)] * len(ids)
        self.text += text


def _sent(messages: list[dict[str, Any]], opened: int) -> list[tuple[Any, Any]]:
    """``(role, content)`` of the messages a client sent: the first call's ``opened`` ones, then all but the replies."""
    return [(m.get("role"), m.get("content")) for i, m in enumerate(messages) if i < opened or m.get("role") != "assistant"]


#: Request fields the server applies (``model`` is accepted whatever it names; ``seed`` is the runtime's).
#: the request header that names a session where the body does not (verifiers' OpenAI clients send it)
SESSION_HEADER = "X-Session-ID"
APPLIED_FIELDS = frozenset({"model", "messages", "prompt", "session_id", "max_tokens", "max_completion_tokens",
                            "temperature", "top_p", "logprobs", "user", "seed", "stream", "stream_options", "tools"})


def unsupported_fields(body: dict[str, Any]) -> list[str]:
    """Fields of a completion request the server would otherwise ignore (``stop``, ``tools``, ``top_k``,
    penalties, ``n`` above 1, streaming…): the request is refused, so an agent never gets a completion
    sampled other than it asked without knowing."""
    neutral = {"n": 1, "top_logprobs": 0, "tool_choice": "auto", "parallel_tool_calls": True}
    return sorted(key for key, value in body.items()
                  if key not in APPLIED_FIELDS and value is not None and neutral.get(key, object()) != value)


def render_chat(tokenizer: Any, messages: list[dict[str, Any]], tools: Any = None,
                template_kwargs: dict[str, Any] | None = None) -> str:
    """The chat template's text for ``messages`` (and the ``tools`` they may call) with the generation prompt and
    the run's ``--data.chat_template_kwargs``."""
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True,
                                             **({"tools": tools} if tools else {}), **(template_kwargs or {}))
    except Exception as exc:  # noqa: BLE001 - a malformed message list is the client's error
        raise SessionError(f"cannot apply the chat template to the messages: {exc}") from exc


def build_app(state: Any) -> Any:
    """The FastAPI app. ``state`` has ``tokenizer``, ``client`` (EngineClient), ``sessions`` (id -> Session),
    ``max_tokens`` (the per-call default and cap), ``seed`` and ``tool_parser``."""
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, StreamingResponse

    app = FastAPI(title="rlhf agent server")

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {"object": "list", "data": [{"id": state.model_name, "object": "model", "owned_by": "rlhf"}]}

    async def complete(body: dict[str, Any], prompt: Any, chat: bool, headers: Any) -> Any:
        # the body's session_id (the OpenAI SDK's extra_body), else the X-Session-ID header (verifiers' clients)
        session_id = str(body.get("session_id") or headers.get(SESSION_HEADER) or "")
        session = state.sessions.get(session_id)
        if session is None:
            return JSONResponse({"error": {"message": f"unknown session_id {session_id!r}: pass the session_id "
                                                      f"run_agent received in extra_body or the {SESSION_HEADER} "
                                                      "header"}}, status_code=400)
        unsupported = unsupported_fields(body)
        if unsupported:
            session.error = (f"the request sets {', '.join(unsupported)}, which the rlhf agent server does not apply "
                             f"(it applies {', '.join(sorted(APPLIED_FIELDS))}); remove them")
            return JSONResponse({"error": {"message": session.error}}, status_code=400)
        try:
            tokens = (session.extend_chat(prompt, body.get("tools"), state.tokenizer, state.template_kwargs) if chat
                      else session.extend_prompt(prompt, state.tokenizer))
        except SessionError as exc:
            session.error = str(exc)
            return JSONResponse({"error": {"message": str(exc)}}, status_code=400)
        max_tokens = min(int(body.get("max_tokens") or body.get("max_completion_tokens") or state.max_tokens), state.max_tokens)
        session.calls += 1
        out = await state.client.generate(tokens, max_tokens, state.seed(session_id, session.calls),
                                          body.get("temperature"), body.get("top_p"))
        ids = out["response_ids"]
        content = state.tokenizer.decode(ids, skip_special_tokens=True)
        session.add(ids, out["logprobs"], is_action=True, text=content)
        session.last_finish, session.last_turn_ids = out["finish_reason"], ids
        if out["finish_reason"] == "stop" and ids and ids[-1] in state.tokenizer.all_special_ids:
            session.pending_stop = state.tokenizer.decode(ids[-1:], skip_special_tokens=False)
        logprobs = {"content": [{"token": state.tokenizer.decode([t]), "logprob": lp, "bytes": None, "top_logprobs": []}
                                for t, lp in zip(ids, out["logprobs"])]} if body.get("logprobs") else None
        text, calls = parse_tool_calls(content, state.tool_parser) if chat and body.get("tools") else (content, [])
        finish = "tool_calls" if calls else out["finish_reason"]
        head = {"id": f"rlhf-{uuid.uuid4().hex[:12]}", "created": int(time.time()), "model": state.model_name}
        usage = {"prompt_tokens": len(tokens), "completion_tokens": len(ids), "total_tokens": len(tokens) + len(ids)}
        if body.get("stream"):
            return StreamingResponse(_streamed(head, chat, text, calls, finish, logprobs,
                                               usage if (body.get("stream_options") or {}).get("include_usage") else None),
                                     media_type="text/event-stream")
        choice: dict[str, Any] = {"index": 0, "finish_reason": finish, "logprobs": logprobs}
        if chat:
            choice["message"] = {"role": "assistant", "content": text, **({"tool_calls": calls} if calls else {})}
        else:
            choice["text"] = content
        return {**head, "object": "chat.completion" if chat else "text_completion", "choices": [choice], "usage": usage,
                "token_ids": {"prompt_token_ids": tokens, "completion_token_ids": ids}}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Any:
        body = await request.json()
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            return JSONResponse({"error": {"message": "messages must be a list of message objects"}}, status_code=400)
        return await complete(body, messages, chat=True, headers=request.headers)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Any:
        body = await request.json()
        prompt = body.get("prompt")
        if not isinstance(prompt, str):
            return JSONResponse({"error": {"message": "prompt must be one string"}}, status_code=400)
        return await complete(body, prompt, chat=False, headers=request.headers)

    @app.post("/tokenize")
    async def tokenize(request: Request) -> dict[str, Any]:
        body = await request.json()
        text = (render_chat(state.tokenizer, body["messages"], body.get("tools"), state.template_kwargs)
                if "messages" in body else str(body.get("prompt", "")))
        return {"tokens": state.tokenizer(text, add_special_tokens=False)["input_ids"]}

    return app


def _streamed(head: dict[str, Any], chat: bool, content: str | None, calls: list[dict[str, Any]], finish: str,
              logprobs: Any, usage: dict[str, int] | None) -> Any:
    """A completion as OpenAI's server-sent events: the whole text in one chunk (the engines answer a turn at once,
    batched with the other episodes' turns), then the finish reason, the usage when asked, and ``[DONE]``."""
    import json

    kind = "chat.completion.chunk" if chat else "text_completion"

    def chunk(piece: dict[str, Any] | None, reason: str | None, **extra: Any) -> str:
        choices = [] if piece is None else [{"index": 0, **piece, "finish_reason": reason}]
        return f"data: {json.dumps({**head, 'object': kind, 'choices': choices, **extra})}\n\n"

    if chat:
        delta = {"role": "assistant", "content": content}
        if calls:
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(calls)]
        yield chunk({"delta": delta, "logprobs": logprobs}, None)
        yield chunk({"delta": {}}, finish)
    else:
        yield chunk({"text": content, "logprobs": logprobs}, None)
        yield chunk({"text": ""}, finish)
    if usage is not None:
        yield chunk(None, None, usage=usage)
    yield "data: [DONE]\n\n"
