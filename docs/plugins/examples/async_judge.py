"""An async reward function: each sample is scored by an awaitable, all samples concurrently.

A real judge would await an HTTP client here (e.g. httpx.AsyncClient); this example awaits a
local rule so it runs anywhere: 1.0 when the response ends with the label, else 0.0. The core
awaits the coroutine once per rollout batch (``asyncio.run``), so concurrency comes from
``asyncio.gather`` inside the call. Load it with ``--plugins ./async_judge.py`` and select it
with ``--reward.functions ends_with_label``.
"""

import asyncio

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs


async def judge(response: str, label: str) -> float:
    await asyncio.sleep(0)  # stands for the request to a judge
    return float(response.strip().endswith(label))


async def ends_with_label(queries, prompts, labels, **columns):
    responses = [query[len(prompt):] for query, prompt in zip(queries, prompts)]
    return list(await asyncio.gather(*(judge(r, str(label)) for r, label in zip(responses, labels))))


@rlhf.hookimpl
def rlhf_register_reward_functions(register):
    register("ends_with_label", ends_with_label, description="async: the response ends with the label")
