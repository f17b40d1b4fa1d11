"""The OpenAI-server executor with the real `openai` client against the real server, on an in-process HF engine."""

from __future__ import annotations

from pathlib import Path

import pytest
from rlhf_agents import load_agent_class
from rlhf_plugin_openai_server.executor import OpenAIServerExecutor, OpenAIServerOptions

AGENT = Path(__file__).parent / "guess_number_agent.py"
SAMPLING = {"temperature": 1.0, "top_p": 1.0}


@pytest.fixture(scope="module")
def engine(tiny_causal_lm_path):
    from rlhf_plugin_hf_generate.engine import HFEngine

    return HFEngine(str(tiny_causal_lm_path), "fp32", 256, 0, {"vllm": {}})


def executor_for(path: Path, model: Path, timeout: float = 60.0) -> OpenAIServerExecutor:
    return OpenAIServerExecutor(str(path), load_agent_class(str(path), ("AgentExecutor",)), str(model), 256,
                                OpenAIServerOptions(episode_timeout_s=timeout))


def requests_for(count: int):
    return [{"prompt_ids": [1], "prompt": "guess the number", "label": str(1 + i % 4), "max_tokens": 8, "seed": i}
            for i in range(count)]


def test_sessions_become_token_trajectories(engine, tiny_causal_lm_path) -> None:
    import torch

    executor = executor_for(AGENT, tiny_causal_lm_path)
    tokenizer = executor.tokenizer
    results = executor.run(requests_for(6), engine, SAMPLING)
    assert all("error" not in r["agent"] for r in results), [r["agent"] for r in results]
    first_prompt = tokenizer.apply_chat_template([{"role": "user", "content": "guess the number"}], tokenize=False,
                                                 add_generation_prompt=True)
    for result in results:
        assert tokenizer.decode(result["prompt_ids"]) == first_prompt
        mask = result["action_mask"]
        assert len(mask) == len(result["response_ids"]) == len(result["logprobs"])
        turns = result["agent"]["extra_logs"]["turns"]
        model_spans = sum(1 for i, m in enumerate(mask) if m == 1 and (i == 0 or mask[i - 1] == 0))
        assert model_spans == turns  # one completion per turn, separated by the agent's user turns
        user_text = tokenizer.decode([t for t, m in zip(result["response_ids"], mask) if m == 0])
        assert all(word in ("higher", "lower", "a number please") for word in
                   [w.strip() for w in user_text.replace("<|user|>", "|").replace("<|assistant|>", "|")
                    .replace("</s>", "|").split("|") if w.strip()])
        tokens = result["prompt_ids"] + result["response_ids"]
        with torch.no_grad():
            logits = engine.model(torch.tensor([tokens])).logits[0, :-1].float()
        forward = torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens[1:])[:, None])[:, 0]
        forward = forward[len(result["prompt_ids"]) - 1:]
        chosen = torch.tensor(mask, dtype=torch.bool)
        assert torch.allclose(torch.tensor(result["logprobs"])[chosen], forward[chosen], atol=1e-4)


BROKEN_AGENTS = {
    "raises": ("raise RuntimeError('agent exploded')", "run_agent raised RuntimeError: agent exploded"),
    "no_session": ("await client.completions.create(model='m', prompt='hi', max_tokens=2)\n        return {'reward': 1.0}",
                   "run_agent raised BadRequestError"),
    "rewrites_history": ("await client.completions.create(model='m', prompt='hi', max_tokens=2, extra_body=sid)\n"
                         "        await client.completions.create(model='m', prompt='bye', max_tokens=2, extra_body=sid)\n"
                         "        return {'reward': 1.0}", "run_agent raised BadRequestError"),
    "chat_rewrites_history": (
        "m = [{'role': 'user', 'content': 'hi'}]\n"
        "        r = await client.chat.completions.create(model='m', messages=m, max_tokens=2, extra_body=sid)\n"
        "        m = [{'role': 'user', 'content': 'hello'}, {'role': 'assistant', 'content': r.choices[0].message.content},\n"
        "             {'role': 'user', 'content': 'again'}]\n"
        "        await client.chat.completions.create(model='m', messages=m, max_tokens=2, extra_body=sid)\n"
        "        return {'reward': 1.0}",
        "run_agent raised BadRequestError: Error code: 400 - prefix stability: the messages "
        "before the last reply differ"),
    "chat_drops_a_reply": (
        "m = [{'role': 'user', 'content': 'hi'}]\n"
        "        await client.chat.completions.create(model='m', messages=m, max_tokens=2, extra_body=sid)\n"
        "        await client.chat.completions.create(model='m', messages=m + m, max_tokens=2, extra_body=sid)\n"
        "        return {'reward': 1.0}",
        "run_agent raised BadRequestError: Error code: 400 - prefix stability: the messages "
        "hold 0 assistant replies, the session returned 1"),
    "stop_words": ("await client.completions.create(model='m', prompt='hi', max_tokens=2, stop=['x'],\n"
                   "            presence_penalty=0.5, extra_body=sid)\n        return {'reward': 1.0}",
                   "run_agent raised BadRequestError: Error code: 400 - the request sets presence_penalty, stop, "
                   "which the rlhf agent server does not apply"),
}


@pytest.mark.parametrize("kind", sorted(BROKEN_AGENTS))
def test_a_failing_agent_fails_its_episode(kind, engine, tiny_causal_lm_path, tmp_path) -> None:
    body, expected = BROKEN_AGENTS[kind]
    agent = tmp_path / f"{kind}.py"
    agent.write_text("import openai\nfrom rlhf_plugin_openai_server import OpenAIServerAgent\n\n\n"
                     "class AgentExecutor(OpenAIServerAgent):\n    async def run_agent(self, prompt, label, session_id):\n"
                     "        client = openai.AsyncOpenAI(base_url=self.base_url, api_key='x', max_retries=0)\n"
                     "        sid = {'session_id': session_id}\n"
                     f"        {body}\n")
    results = executor_for(agent, tiny_causal_lm_path).run(requests_for(2), engine, SAMPLING)
    for result in results:
        assert result["agent"]["error"].startswith(f"--train.agent_func_path {agent}: {expected}"), result["agent"]["error"]


def test_a_client_that_names_its_session_in_the_x_session_id_header_is_served(engine, tiny_causal_lm_path, tmp_path) -> None:
    """verifiers' OpenAI clients name the rollout's session in an X-Session-ID header, not in the body: served as the
    body's session_id is (it was HTTP 400, "unknown session_id ''"), one model turn of the trajectory per call."""
    agent = tmp_path / "header_agent.py"
    agent.write_text(
        "import openai\nfrom rlhf_plugin_openai_server import OpenAIServerAgent\n\n\n"
        "class AgentExecutor(OpenAIServerAgent):\n    async def run_agent(self, prompt, label, session_id):\n"
        "        client = openai.AsyncOpenAI(base_url=self.base_url, api_key='x', max_retries=0,\n"
        "                                    default_headers={'X-Session-ID': session_id})\n"
        "        messages = [{'role': 'user', 'content': prompt}]\n"
        "        for _ in range(2):\n"
        "            reply = await client.chat.completions.create(model=self.model_name, messages=messages, max_tokens=3)\n"
        "            messages += [{'role': 'assistant', 'content': reply.choices[0].message.content},\n"
        "                         {'role': 'user', 'content': 'again'}]\n"
        "        await client.close()\n        return {'reward': 1.0}\n")
    results = executor_for(agent, tiny_causal_lm_path).run(requests_for(2), engine, SAMPLING)
    assert [r["agent"].get("error") for r in results] == [None, None]
    for result in results:
        mask = result["action_mask"]
        assert sum(1 for i, m in enumerate(mask) if m == 1 and (i == 0 or mask[i - 1] == 0)) == 2  # two model turns


def test_few_shot_assistant_messages_in_the_first_call_are_not_replies(engine, tiny_causal_lm_path, tmp_path) -> None:
    """A chat whose first call carries worked examples (assistant messages the model never wrote) goes on for a second
    call: only the replies the session returned count as the model's turns."""
    agent = tmp_path / "few_shot_agent.py"
    agent.write_text(
        "import openai\nfrom rlhf_plugin_openai_server import OpenAIServerAgent\n\n\n"
        "class AgentExecutor(OpenAIServerAgent):\n    async def run_agent(self, prompt, label, session_id):\n"
        "        client = openai.AsyncOpenAI(base_url=self.base_url, api_key='x', max_retries=0,\n"
        "                                    default_headers={'X-Session-ID': session_id})\n"
        "        messages = [{'role': 'user', 'content': '1+1?'}, {'role': 'assistant', 'content': '2'},\n"
        "                    {'role': 'user', 'content': prompt}]\n"
        "        for _ in range(2):\n"
        "            reply = await client.chat.completions.create(model=self.model_name, messages=messages, max_tokens=3)\n"
        "            messages += [{'role': 'assistant', 'content': reply.choices[0].message.content},\n"
        "                         {'role': 'user', 'content': 'again'}]\n"
        "        await client.close()\n        return {'reward': 1.0}\n")
    results = executor_for(agent, tiny_causal_lm_path).run(requests_for(2), engine, SAMPLING)
    assert [r["agent"].get("error") for r in results] == [None, None]
    for result in results:
        assert [value for value, _, _ in spans(result["action_mask"])] == [1, 0, 1]


def test_a_streaming_client_gets_the_turn_as_server_sent_events(engine, tiny_causal_lm_path, tmp_path) -> None:
    """``stream=True`` (chat and completions, the OpenAI SDK's own stream reader): the chunks join to the text the
    trajectory holds, the last choice chunk carries the finish reason, and include_usage adds the token counts."""
    agent = tmp_path / "streaming_agent.py"
    agent.write_text(
        "import openai\nfrom rlhf_plugin_openai_server import OpenAIServerAgent\n\n\n"
        "class AgentExecutor(OpenAIServerAgent):\n    async def run_agent(self, prompt, label, session_id):\n"
        "        client = openai.AsyncOpenAI(base_url=self.base_url, api_key='x', max_retries=0,\n"
        "                                    default_headers={'X-Session-ID': session_id})\n"
        "        messages = [{'role': 'user', 'content': prompt}]\n"
        "        stream = await client.chat.completions.create(model=self.model_name, messages=messages, max_tokens=4,\n"
        "                                                      stream=True, stream_options={'include_usage': True})\n"
        "        text, finish, usage = '', None, None\n"
        "        async for chunk in stream:\n"
        "            usage = chunk.usage or usage\n"
        "            for choice in chunk.choices:\n"
        "                text += choice.delta.content or ''\n                finish = choice.finish_reason or finish\n"
        "        await client.close()\n"
        "        return {'reward': 1.0, 'columns': {'text': text, 'finish': finish, 'tokens': usage.completion_tokens}}\n")
    results = executor_for(agent, tiny_causal_lm_path).run(requests_for(2), engine, SAMPLING)
    assert [r["agent"].get("error") for r in results] == [None, None]
    tokenizer = executor_for(agent, tiny_causal_lm_path).tokenizer
    for result in results:
        columns = result["agent"]["columns"]
        assert columns["text"] == tokenizer.decode(result["response_ids"], skip_special_tokens=True)
        assert columns["finish"] == result["finish_reason"] and columns["tokens"] == len(result["response_ids"])


class ToolCaller:
    """A scripted engine with Qwen3's tokens: the first turn calls the ``add`` tool, the turn after its result answers."""

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.result_tag = tokenizer.convert_tokens_to_ids("<tool_response>")
        self.end = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def generate(self, requests, temperature, top_p):
        out = []
        for request in requests:
            answered = self.result_tag in request["prompt_ids"]
            text = "The sum is 5." if answered else '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
            ids = [*self.tokenizer(text, add_special_tokens=False)["input_ids"], self.end]
            out.append({"response_ids": ids, "logprobs": [-0.25] * len(ids), "finish_reason": "stop"})
        return out


TOOL_AGENT = """import json
import openai
from rlhf_plugin_openai_server import OpenAIServerAgent

ADD = {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}


class AgentExecutor(OpenAIServerAgent):
    async def run_agent(self, prompt, label, session_id):
        client = openai.AsyncOpenAI(base_url=self.base_url, api_key="x", max_retries=0,
                                    default_headers={"X-Session-ID": session_id})
        messages = [{"role": "user", "content": prompt}]
        first = await client.chat.completions.create(model=self.model_name, messages=messages, tools=[ADD])
        call = first.choices[0].message.tool_calls[0]
        arguments = json.loads(call.function.arguments)
        messages += [first.choices[0].message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": str(arguments["a"] + arguments["b"])}]
        second = await client.chat.completions.create(model=self.model_name, messages=messages, tools=[ADD])
        await client.close()
        answer = second.choices[0].message.content
        return {"reward": float("5" in answer), "columns": {"finish": first.choices[0].finish_reason,
                                                            "tool": call.function.name, "answer": answer}}
"""


def test_a_tool_calling_agent_is_served_and_its_trajectory_is_the_templates_conversation(tmp_path) -> None:
    """tools in the request reach the chat template; the model's <tool_call> block comes back as tool_calls (finish
    tool_calls); the tool result the agent sends next is rendered after the model's own tokens, so the session is,
    token for token, Qwen3's template of the whole conversation with the tools."""
    from rlhf.models.loading import load_tokenizer
    from rlhf.testing.real_tokenizers import fetch_tokenizer

    qwen3 = fetch_tokenizer("qwen3")
    agent = tmp_path / "tool_agent.py"
    agent.write_text(TOOL_AGENT)
    executor = OpenAIServerExecutor(str(agent), load_agent_class(str(agent), ("AgentExecutor",)), str(qwen3), 1024,
                                    OpenAIServerOptions())
    tokenizer = load_tokenizer(str(qwen3), "--actor.model_name_or_path")
    request = {"prompt_ids": [1], "prompt": "What is 2 + 3?", "label": "5", "max_tokens": 64, "seed": 0}
    (result,) = executor.run([request], ToolCaller(tokenizer), SAMPLING)
    assert result["agent"]["columns"] == {"finish": "tool_calls", "tool": "add", "answer": "The sum is 5."}
    assert result["agent"]["reward"] == 1.0
    assert [value for value, _, _ in spans(result["action_mask"])] == [1, 0, 1]
    # the prompt as the template renders it with the tools, then the model's tokens and Qwen3's tool-response turn
    # (the template would add empty think blocks if it re-rendered the replies; the model's own tokens stand)
    tool = {"type": "function", "function": {"name": "add", "description": "Add two integers.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}}
    opening = tokenizer.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], tools=[tool], tokenize=False,
                                            add_generation_prompt=True)
    whole = (opening + '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call><|im_end|>'
             "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
             "The sum is 5.<|im_end|>")
    assert result["prompt_ids"] + result["response_ids"] == tokenizer(whole, add_special_tokens=False)["input_ids"]


def spans(mask):
    out, start = [], 0
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start]:
            out.append((mask[start], start, i))
            start = i
    return out


def test_tool_call_blocks_become_tool_calls_and_anything_else_stays_text() -> None:
    from rlhf_plugin_openai_server.tool_calls import parse_tool_calls

    text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call><tool_call>{"name": "x", ' \
           '"arguments": "{}"}</tool_call>'
    content, calls = parse_tool_calls(text, "hermes")
    assert content == "Let me add." and [c["function"] for c in calls] == [
        {"name": "add", "arguments": '{"a": 1}'}, {"name": "x", "arguments": "{}"}]
    assert len({c["id"] for c in calls}) == 2
    assert parse_tool_calls('<tool_call>{"name": "add"}</tool_call>', "hermes")[0] is None  # only calls: no content
    for kept in ("<tool_call>not json</tool_call>", '<tool_call>{"arguments": {}}</tool_call>', "plain"):
        assert parse_tool_calls(kept, "hermes") == (kept, [])
    assert parse_tool_calls(text, "none") == (text, [])
