"""The DeepSpeed backend passes the training-backend kit: its steps equal plain torch's, it resumes exactly."""

from rlhf_plugin_deepspeed.backend import DeepSpeedBackend

from rlhf.testing.conformance import TrainingBackendKit


class TestDeepSpeedBackend(TrainingBackendKit):
    component = DeepSpeedBackend
    plugin_module = "rlhf_plugin_deepspeed"
    registered_name = "deepspeed"
