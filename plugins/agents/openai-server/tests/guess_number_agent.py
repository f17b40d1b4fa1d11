"""Guess the number (1-4) as an OpenAI-SDK agent: the policy is asked over /v1/chat/completions,
the agent answers "higher"/"lower" as the user, at most 4 turns."""

import re

import openai
from rlhf_plugin_openai_server import OpenAIServerAgent


class AgentExecutor(OpenAIServerAgent):
    async def run_agent(self, prompt, label, session_id):
        client = openai.AsyncOpenAI(base_url=self.base_url, api_key="unused", max_retries=0)
        messages, secret = [{"role": "user", "content": prompt}], int(label)
        for turn in range(4):
            reply = await client.chat.completions.create(model=self.model_name, messages=messages, max_tokens=4,
                                                         extra_body={"session_id": session_id})
            answer = reply.choices[0].message.content
            digit = re.search(r"\d", answer)
            guess = int(digit.group()) if digit else None
            if guess == secret:
                return {"reward": 1.0 - 0.25 * turn, "scores": 1.0, "extra_logs": {"turns": turn + 1}}
            messages += [{"role": "assistant", "content": answer},
                         {"role": "user", "content": "a number please" if guess is None else
                          ("higher" if guess < secret else "lower")}]
        await client.close()
        return {"reward": 0.0, "scores": 0.0, "extra_logs": {"turns": 4}}
