"""Early stop: end the run when the mean step reward has not improved for a while.

The run stops after ``--early_stop.patience`` steps in a row whose reward is not above the
best so far by more than ``--early_stop.min_delta``; it then saves its model as a finished run
does and ends with status ``stopped`` (``run_status.json`` in the output dir holds the reason).
The best reward and the count are stored in the run's checkpoints (``rlhf_checkpoint_save`` /
``rlhf_checkpoint_load``), so a resumed run counts on. Load it with ``--plugins ./early_stop.py``.
"""

from pydantic import BaseModel, Field

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs


class EarlyStopOptions(BaseModel):
    patience: int = Field(5, ge=1, description="steps without improvement before the run stops")
    min_delta: float = Field(0.0, ge=0, description="how much the reward must rise to count as an improvement")


options = EarlyStopOptions()
tracked = {"best": None, "since_best": 0}


@rlhf.hookimpl
def rlhf_register_options(register):
    register(EarlyStopOptions)


@rlhf.hookimpl
def rlhf_train_start(config, run_dir):
    global options
    options = EarlyStopOptions.model_validate(config.plugins.get("early_stop", {}))


@rlhf.hookimpl
def rlhf_steer(step, metrics, steering):
    reward = metrics["reward"]
    if tracked["best"] is None or reward > tracked["best"] + options.min_delta:
        tracked["best"], tracked["since_best"] = reward, 0
        return
    tracked["since_best"] += 1
    if tracked["since_best"] >= options.patience:
        steering.stop(f"reward plateaued: no rise above {tracked['best']:.4g} + {options.min_delta:g} "
                      f"for {tracked['since_best']} steps")


@rlhf.hookimpl
def rlhf_checkpoint_save(step, checkpoint_dir, state):
    state["early_stop"] = dict(tracked)


@rlhf.hookimpl
def rlhf_checkpoint_load(step, checkpoint_dir, state):
    tracked.update(state.get("early_stop", {}))
