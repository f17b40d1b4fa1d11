"""The GSPO loss through the policy-loss kit."""

from rlhf_plugin_gspo import GSPOLoss

from rlhf.testing.conformance import PolicyLossKit


class TestGSPO(PolicyLossKit):
    component, plugin_module, registered_name = GSPOLoss, "rlhf_plugin_gspo", "gspo"
