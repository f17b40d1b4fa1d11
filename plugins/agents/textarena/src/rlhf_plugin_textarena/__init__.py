"""``textarena``: textarena's single-player games as multi-turn environments.

``--train.agent_executor textarena --textarena.env_id GuessTheNumber-v0`` plays one game per episode: the game's
prompt is the first user turn, each model turn is the player's move, and the game's replies come back as user turns
rendered by the policy's chat template (with ``--data.apply_chat_template``; as text otherwise). The episode's reward
is the player's reward when the game ends, and a finished game ends the episode with finish ``stop``.
``--data.prompt_source textarena`` makes the rows: one game seed per prompt, so the samples of one prompt play the
same game. docs/environments.md has the recipe.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_agent_executors(register):
    register("textarena", "rlhf_plugin_textarena.games:TextArenaExecutor",
             description="textarena's single-player games, one per episode, in chat turns")


@rlhf.hookimpl
def rlhf_register_prompt_sources(register):
    register("textarena", "rlhf_plugin_textarena.games:GameSeeds", description="one seeded textarena game per prompt")


@rlhf.hookimpl
def rlhf_register_options(register):
    register("rlhf_plugin_textarena.games:GameOptions", namespace="textarena")
