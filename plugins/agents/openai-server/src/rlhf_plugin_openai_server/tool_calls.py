"""Tool calls in a completion's text, as OpenAI's ``message.tool_calls``.

Models write tool calls as text in their own format; the server reads them with the parser
``--openai_server.tool_parser`` names. ``hermes`` reads ``<tool_call>{"name": …, "arguments": …}</tool_call>``
blocks (Qwen2.5, Qwen3, Hermes and the many models trained on that format); ``none`` leaves the text as it is. A
block that is not JSON with a ``name`` stays in the content: the agent sees what the model wrote.
"""

import json
import re
import uuid
from typing import Any

_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_tool_calls(text: str, parser: str) -> tuple[str | None, list[dict[str, Any]]]:
    """``(content, tool_calls)`` of a completion: the text outside the calls (None when there is none, as OpenAI
    answers) and each call as ``{"id", "type": "function", "function": {"name", "arguments": JSON text}}``."""
    if parser == "none":
        return text, []
    calls, kept, last = [], [], 0
    for match in _HERMES.finditer(text):
        try:
            call = json.loads(match.group(1))
        except json.JSONDecodeError:
            continue
        if not isinstance(call, dict) or not isinstance(call.get("name"), str):
            continue
        arguments = call.get("arguments", {})
        calls.append({"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": call["name"],
                                   "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}})
        kept.append(text[last:match.start()])
        last = match.end()
    if not calls:
        return text, []
    content = ("".join(kept) + text[last:]).strip()
    return content or None, calls
