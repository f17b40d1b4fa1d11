"""Training backends on the simulated accelerator (:mod:`rlhf.testing.accelerator`), as a plugin for tests.

``--plugins rlhf.testing.simulated_backends --train.backend simulated-deepspeed`` (or ``simulated-fsdp2``)
trains with the real backend, every model it builds put on the simulated device: a run whose trainer feeds
a model a CPU tensor, or mixes one into a loss, fails on a CPU machine as it would on a GPU. The worker
processes load the plugin with the run's plugin set; each enters the simulation as it builds its backend.
"""

from __future__ import annotations

from typing import Any

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_training_backends(register: Any) -> None:
    register("simulated-deepspeed", "rlhf.testing.accelerator:SimulatedDeepSpeed",
             description="DeepSpeed, its models on a simulated accelerator (tests)")
    register("simulated-fsdp2", "rlhf.testing.accelerator:SimulatedFSDP2",
             description="FSDP2, its models on a simulated accelerator (tests)")
