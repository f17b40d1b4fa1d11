"""``reasoning_gym``: the procedural tasks of reasoning-gym as a prompt source, and its scorers as a reward.

``--data.prompt_source reasoning_gym --reasoning_gym.tasks basic_arithmetic,chain_sum`` makes each step's prompts
from reasoning-gym's generators, seeded by the run's seed and each row's position (a resumed run makes the same
rows). ``--reasoning_gym.curriculum true`` walks each task's own curriculum: a batch whose mean score reaches
``--reasoning_gym.raise_at`` raises that task's level, one at or below ``--reasoning_gym.lower_at`` lowers it.
``--reward.functions reasoning_gym`` scores the ``<answer>…</answer>`` of each response with the task's own
``score_answer``. docs/environments.md has the whole recipe.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_prompt_sources(register):
    register("reasoning_gym", "rlhf_plugin_reasoning_gym.tasks:ReasoningGymTasks",
             description="reasoning-gym's procedural tasks, with their curricula")


@rlhf.hookimpl
def rlhf_register_reward_functions(register):
    register("reasoning_gym", "rlhf_plugin_reasoning_gym.scoring:ReasoningGymScore",
             description="reasoning-gym's own score_answer of the <answer> tag")


@rlhf.hookimpl
def rlhf_register_options(register):
    register("rlhf_plugin_reasoning_gym.tasks:ReasoningGymOptions", namespace="reasoning_gym")
