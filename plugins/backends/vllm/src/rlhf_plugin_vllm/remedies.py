"""What vLLM offers ``rlhf plan``'s search where a run does not fit (:meth:`VLLMEngine.plan_remedies`).

vLLM engines on the GPUs the model groups leave free; OpenRLHF's hybrid engine (vLLM on the actor's GPUs, each side
asleep while the other works), at the run's ``--vllm.gpu_memory_utilization`` and then at lower ones; and sleep for
engines that share GPUs already. The training backend's own sleep flags (``run.backend_sleep``) go with vLLM's."""

from __future__ import annotations

from typing import Any

from rlhf.planning import Remedy, RemedyContext

#: --vllm.gpu_memory_utilization the hybrid engine is tried with below the run's own: less KV cache, slower sampling
HYBRID_UTILIZATION = (0.8, 0.6, 0.4)


def vllm_remedies(config: Any, run: RemedyContext) -> list[Remedy]:
    """The changes that move generation to vLLM or make room for it. ``auto`` picks vLLM for ``--vllm.num_engines``
    above 0, so a run on another engine is switched back to ``auto``."""
    vllm = config.vllm
    auto = {} if config.rollout.engine == "auto" else {"rollout.engine": "auto"}
    tp, found = vllm.tensor_parallel_size, []
    if (run.gpus - run.model_gpus) // tp >= 1:
        found.append(Remedy({**auto, "vllm.num_engines": (run.gpus - run.model_gpus) // tp}, "engine",
                            "vLLM engines on the free GPUs: a second copy of the weights and a weight sync"))
    hybrid = {**auto, "vllm.num_engines": max(1, run.ranks.get("actor", 1) // tp), "train.colocate_all": True,
              "vllm.enable_sleep": True}
    for utilization in (vllm.gpu_memory_utilization, *(u for u in HYBRID_UTILIZATION if u < vllm.gpu_memory_utilization)):
        shown = {} if utilization == vllm.gpu_memory_utilization else {"vllm.gpu_memory_utilization": utilization}
        found += [Remedy({**hybrid, **sleep, **shown}, "engine", "vLLM on the actor's GPUs, each side asleep while "
                         f"the other works, with {utilization:g} of each GPU", (), frozenset({"share GPUs", "sleep"}))
                  for sleep in [*run.backend_sleep, {}]]
    found += [Remedy({"vllm.enable_sleep": True, **sleep}, "sleep", "the engines' weights and KV cache freed while the "
                     "models train", ("weights", "KV cache")) for sleep in run.backend_sleep or [{}]]
    return found
