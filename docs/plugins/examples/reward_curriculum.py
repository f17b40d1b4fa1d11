"""A curriculum: as the reward rises, move prompt-sampling weight from the first prompt dataset
to the last (e.g. ``--data.prompt_dataset easy.jsonl,hard.jsonl``).

After each step whose mean reward is at least ``--reward_curriculum.reward_threshold``, the
plugin moves ``--reward_curriculum.shift`` of the weight from the first source to the last, until
the last one has it all. It keeps no state of its own: it reads the current weights from the
``steering`` handle, and the run stores them in its checkpoints, so a resumed run continues the
curriculum where it was. Load it with ``--plugins ./reward_curriculum.py``.
"""

from pydantic import BaseModel, Field

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs


class CurriculumOptions(BaseModel):
    reward_threshold: float = Field(0.5, description="mean step reward from which the mix moves on")
    shift: float = Field(0.1, gt=0, le=1, description="weight moved from the first to the last dataset per such step")


options = CurriculumOptions()


@rlhf.hookimpl
def rlhf_register_options(register):
    register(CurriculumOptions)


@rlhf.hookimpl
def rlhf_train_start(config, run_dir):
    global options
    options = CurriculumOptions.model_validate(config.plugins.get("reward_curriculum", {}))


@rlhf.hookimpl
def rlhf_steer(step, metrics, steering):
    weights = list(steering.current_prompt_weights)
    if len(weights) < 2 or metrics.get("reward", 0.0) < options.reward_threshold or weights[-1] >= 1.0:
        return
    moved = min(options.shift, weights[0], 1.0 - weights[-1])
    weights[0] -= moved
    weights[-1] += moved
    steering.set_prompt_weights(weights)
