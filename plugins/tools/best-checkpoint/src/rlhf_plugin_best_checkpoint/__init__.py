"""The best checkpoint by an eval metric (``--ckpt.best_metric_key``), kept apart from the rotation.

After each evaluation at ``--eval.steps`` whose metric beats every earlier one (larger is better), the
plugin asks, through ``rlhf_steer``, for the whole checkpoint of that step (training states,
``state.json``, the HF model with ``--ckpt.save_hf``) in ``<ckpt.path>/best/global_step<N>``; the
previous best is removed only once the new one is complete. ``--ckpt.max_num`` and resume look at
``<ckpt.path>/global_step<N>`` only, so the best is never rotated away nor resumed from by accident.
The best value so far travels in every checkpoint (this plugin's entry of its state), so a resumed run
goes on comparing with it.

It is on when evaluations run (``--eval.dataset`` and ``--eval.steps``) and checkpoints are on
(``--ckpt.save_steps``) or ``--ckpt.best_metric_key`` is given; ``''`` picks the first pass@ metric
(``eval/pass1``), as OpenRLHF auto-detects its ``eval_*_pass1``. Evaluations another plugin asks for
between the ``--eval.steps`` ones come after ``rlhf_steer`` and are not ranked.
Process: the controller of an RL run.
"""

import math

import rlhf
from rlhf.errors import ConfigError

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)

#: the folder under --ckpt.path
BEST_DIR = "best"
_run = {"enabled": False, "key": "", "value": None}


@rlhf.hookimpl
def rlhf_train_start(config):
    ckpt, evaluation = getattr(config, "ckpt", None), getattr(config, "eval", None)
    key = getattr(ckpt, "best_metric_key", None)
    evaluating = key is not None and bool(getattr(evaluation, "dataset", None)) and evaluation.steps > 0
    _run.update(enabled=evaluating and (ckpt.save_steps > 0 or bool(key)), key=key or "")


@rlhf.hookimpl
def rlhf_steer(step, metrics, steering):
    evals = sorted(k for k in metrics if k.startswith("eval/"))
    if not _run["enabled"] or not evals:
        return
    key = _run["key"] or next((k for k in evals if k.startswith("eval/pass")), "")
    if key not in metrics:
        raise ConfigError(f"--ckpt.best_metric_key {_run['key']!r}: the evaluation reports no such metric; "
                          f"it reports {', '.join(evals)}")
    value = float(metrics[key])
    if math.isnan(value) or (_run["value"] is not None and value <= _run["value"]):
        return
    _run["value"] = value
    steering.save_checkpoint(f"new best {key} = {value:.4g}", under=BEST_DIR, keep=1)


@rlhf.hookimpl
def rlhf_checkpoint_save(state):
    state["best-checkpoint"] = {"value": _run["value"]}


@rlhf.hookimpl
def rlhf_checkpoint_load(state):
    _run["value"] = state.get("best-checkpoint", {}).get("value")


@rlhf.hookimpl
def rlhf_train_end():
    # forgotten when the run ends (not at its start: a resume loads the value before rlhf_train_start)
    _run.update(enabled=False, value=None)
