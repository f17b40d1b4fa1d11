"""``rlhf generate``: best-of-n sampling with a reward model (OpenRLHF's removed ``batch_inference``).

Samples ``--best_of_n`` responses per prompt (vLLM or HF ``generate``), scores each
prompt + response with a sequence-regression reward model, and post-processes the
samples for the iterative loops OpenRLHF ran from shell scripts:

* ``rs`` — rejection sampling: the best response per prompt, for ``rlhf train sft``;
* ``iter_dpo`` — best vs worst response per prompt, for ``rlhf train dpo``;
* ``csft`` — conditional SFT: every response, its input tagged with its reward.

``--score_only`` scores the responses a file already holds instead of sampling
(``batch_inference --eval_task rm``); the post-processors apply the same way.

This module runs at plugin load (in every process that loads plugins) and only
registers the command lazily; nothing heavy is imported here.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_commands(register):
    register("generate", "rlhf_plugin_best_of_n.command:GenerateCommand",
             description="best-of-n sampling + reward model; post-processors rs / iter_dpo / csft")
