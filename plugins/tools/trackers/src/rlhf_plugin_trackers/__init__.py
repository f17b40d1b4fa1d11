"""TensorBoard and wandb for every trainer's run, as a lifecycle observer.

``--logger.tensorboard_dir DIR`` writes TensorBoard events there; ``--logger.wandb.key KEY`` (or
``WANDB_MODE`` in the environment) logs to wandb, offline when its server does not answer (``wandb
sync`` later). Both take the records ``metrics.jsonl`` gets, every ``--logger.logging_steps`` steps, and
``--logger.samples N`` of the step's samples (TensorBoard text, a wandb Table; every evaluation's too).
A resumed run owns every step after its checkpoint: TensorBoard drops a crashed run's later events.
Process: the controller of an RL run, rank 0 of a supervised one.
"""

import os

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)

_trackers = []


@rlhf.hookimpl
def rlhf_train_start(config, run_dir):
    from rlhf_plugin_trackers.trackers import for_run

    _trackers[:] = for_run(config, run_dir) if os.environ.get("RANK", "0") == "0" else []


@rlhf.hookimpl
def rlhf_step_end(step, metrics):
    for tracker in _trackers:
        tracker.log(step, metrics)


@rlhf.hookimpl
def rlhf_rollout_samples(step, kind, samples):
    for tracker in _trackers:
        tracker.samples(step, kind, samples)


@rlhf.hookimpl
def rlhf_train_end():
    while _trackers:
        _trackers.pop().close()
