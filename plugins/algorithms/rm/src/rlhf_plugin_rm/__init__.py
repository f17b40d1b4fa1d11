"""``rlhf train rm``: reward models from preference pairs (OpenRLHF's ``train_rm``).

A one-output value head (``--ds.value_head_prefix``, default ``score``) reads the reward
at each sequence's last token; Bradley-Terry loss ``sigmoid`` (default) or ``logexp``,
optional per-pair margin. The saved model is an ``AutoModelForSequenceClassification``
whose ``config.json`` carries the ``mean``/``std`` of its rewards for
``--reward.normalize_enable`` at RL time.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_trainers(register):
    register("rm", "rlhf_plugin_rm.trainer:RewardModelTrainer", description="reward model (OpenRLHF train_rm)")
