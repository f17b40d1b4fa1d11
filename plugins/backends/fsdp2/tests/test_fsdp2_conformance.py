"""The FSDP2 backend passes the training-backend kit: its steps equal plain torch's, it resumes exactly, and its
checkpoints read back whole (export and the backend-neutral full state)."""

from rlhf_plugin_fsdp2.backend import FSDP2Backend

from rlhf.testing.conformance import TrainingBackendKit


class TestFSDP2Backend(TrainingBackendKit):
    component = FSDP2Backend
    plugin_module = "rlhf_plugin_fsdp2"
    registered_name = "fsdp2"
