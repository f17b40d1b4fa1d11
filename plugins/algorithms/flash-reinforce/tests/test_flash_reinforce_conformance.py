"""flash_reinforce through the advantage-estimator kit."""

from rlhf_plugin_flash_reinforce import FlashReinforce

from rlhf.testing.conformance import AdvantageEstimatorKit


class TestFlashReinforce(AdvantageEstimatorKit):
    component, plugin_module, registered_name = FlashReinforce, "rlhf_plugin_flash_reinforce", "flash_reinforce"
