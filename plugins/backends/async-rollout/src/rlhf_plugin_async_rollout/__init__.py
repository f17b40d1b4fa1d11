"""The ``async`` rollout scheduler (``--train.async_enable``, or ``--train.rollout_scheduler async``):
a producer thread in the controller generates and rewards the next batches while the workers train.
See :mod:`rlhf_plugin_async_rollout.producer`."""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_rollout_schedulers(register):
    register("async", "rlhf_plugin_async_rollout.producer:AheadOfTraining",
             description="batches generated ahead of training (--train.async_queue_size, partial rollout, oversampling)")
