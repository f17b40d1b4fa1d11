"""AdamW and cosine_with_min_lr through the optimizer and scheduler kits."""

from rlhf_plugin_adamw.optim import AdamW, CosineWithMinLR

from rlhf.testing.conformance import OptimizerKit, SchedulerKit


class TestAdamW(OptimizerKit):
    component, plugin_module, registered_name = AdamW, "rlhf_plugin_adamw", "adam"


class TestCosineWithMinLR(SchedulerKit):
    component, plugin_module, registered_name = CosineWithMinLR, "rlhf_plugin_adamw", "cosine_with_min_lr"
