"""GAE and PPO-clip through their conformance kits."""

from rlhf_plugin_ppo.gae import GAE
from rlhf_plugin_ppo.loss import PPOClipLoss

from rlhf.testing.conformance import AdvantageEstimatorKit, PolicyLossKit


class TestGAE(AdvantageEstimatorKit):
    component, plugin_module, registered_name = GAE, "rlhf_plugin_ppo", "gae"


class TestPPOClip(PolicyLossKit):
    component, plugin_module, registered_name = PPOClipLoss, "rlhf_plugin_ppo", "ppo"


class TestPPOClipHigherWithDualClip(PolicyLossKit):
    plugin_module, registered_name = "rlhf_plugin_ppo", "ppo"

    def make_component(self):
        return PPOClipLoss(eps_low=0.2, eps_high=0.28, dual_clip=3.0)
