"""A reward manager: each sample's reward is the best of two reward functions, and its score the worst.

Load it with ``--plugins docs/plugins/examples/best_of_rewards.py --reward.manager best_of``
(tests/test_reward_stage.py runs it through the controller's reward stage).
"""

import rlhf
from rlhf.components import RewardResult

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs


class BestOf:
    """Built once per run in the controller, with the run's reward sources."""

    def __init__(self, sources):
        # registered reward functions by name, each adapted to one calling convention; an unknown name is
        # one error line naming the flag given here
        self.functions = [sources.function(name, "--reward.functions") for name in ("math_answer", "format")]

    def __call__(self, batch):
        outputs = [f(batch.queries, batch.prompts, batch.labels, **batch.columns) for f in self.functions]
        per_sample = list(zip(*(output.rewards for output in outputs)))
        return RewardResult(rewards=[max(values) for values in per_sample], scores=[min(values) for values in per_sample],
                            logs={"reward/agreement": sum(len(set(v)) == 1 for v in per_sample) / len(per_sample)})


@rlhf.hookimpl
def rlhf_register_reward_managers(register):
    register("best_of", BestOf)
