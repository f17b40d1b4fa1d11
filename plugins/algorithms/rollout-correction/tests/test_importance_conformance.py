"""`importance_sampling`, switched on per token, passes the rollout-correction kit."""

from rlhf_plugin_rollout_correction.importance import ImportanceSampling

from rlhf.testing.conformance import RolloutCorrectionKit, ppo_config


class TestImportanceSampling(RolloutCorrectionKit):
    component = ImportanceSampling
    plugin_module = "rlhf_plugin_rollout_correction"
    registered_name = "importance_sampling"

    def run_config(self):
        return ppo_config(algo={"advantage": {"is_correction_level": "token"}})
