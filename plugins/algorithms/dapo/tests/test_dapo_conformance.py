"""Dynamic filtering through the sample-filter kit, with and without the zero-variance option."""

from rlhf_plugin_dapo.filtering import DynamicFilter

from rlhf.testing.conformance import SampleFilterKit, ppo_config


class TestDynamicFilter(SampleFilterKit):
    component, plugin_module, registered_name = DynamicFilter, "rlhf_plugin_dapo", "dynamic_filtering"


class TestDynamicFilterDroppingZeroVariance(TestDynamicFilter):
    def run_config(self):
        return ppo_config(plugins={"dapo": {"drop_zero_variance": True}})
