"""OpenRLHF reward files: ``--reward.remote_url path/to/reward.py``.

The file defines ``reward_func(queries, prompts, labels, **kwargs)``: ``queries`` are
prompt + response texts, ``prompts`` the prompt texts, ``labels`` the dataset labels.
It returns a list/tensor of rewards or a dict with ``rewards``, ``scores`` and
``extra_logs`` (see :mod:`rlhf.reward_output`).

The loaded term has a ``needs_labels`` attribute: ``True`` when the body of ``reward_func``
uses its third parameter (read from the file's source with :mod:`ast`), so a run whose
term needs labels but has no ``--data.label_key`` is refused at start instead of
scoring empty labels. Setting ``reward_func.needs_labels = True/False`` in the file
overrides the guess.

A file that is missing, cannot be parsed or imported, or defines no callable
``reward_func`` stops the run at start with one ``rlhf: error:`` line naming the file
(and the line) and the fix, a :class:`rlhf.errors.RewardSourceError`; so does an exception
raised by ``reward_func`` under ``--reward.on_error raise`` (the default).
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_reward_functions(register):
    register("reward_func_file", "rlhf_plugin_reward_func.file_reward:RewardFuncFile",
             description="reward_func(queries, prompts, labels) from a .py file")
