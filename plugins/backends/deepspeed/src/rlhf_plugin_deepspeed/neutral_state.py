"""Another ``--train.backend``'s checkpoint into a live ZeRO engine, through the backend-neutral full state
(:func:`rlhf.config.training_backend.load_from_other_backend`): whole fp32 weights and per-parameter optimizer states
by ``named_parameters()`` name, and the optimizer steps taken.

ZeRO 1-3 keep the fp32 master weights and the optimizer's states as flat partitions of each parameter group, and
DeepSpeed writes a parameter's whole value into this rank's part of them with ``safe_set_full_fp32_param`` and
``safe_set_full_optimizer_state``. The optimizer's states exist only after its first step, so they are made first
by one step of the inner torch optimizer with zero gradients and a zero learning rate: the weights stay as they are,
and each state gets the form that optimizer keeps (torch's AdamW counts ``step`` in a tensor, DeepSpeed's fused
and CPU Adam in an int). Then every state is overwritten, ``step`` with the steps taken.
"""

from __future__ import annotations

from typing import Any

from rlhf.errors import CheckpointError

#: Muon's momentum does not cross to or from DeepSpeed: ZeRO's Muon keeps it in buffers of its own layout
#: (stage_1_and_2's _muon_momentum_buffer spans the group's tensors as Muon orthogonalises them whole), which the
#: per-parameter copies of its other states (safe_set_full_optimizer_state, ds_to_universal) do not follow
MUON_REFUSAL = ("Muon's momentum is not converted to or from DeepSpeed, which keeps it in a layout of its own: resume "
                "it with the --train.backend that wrote it (rlhf checkpoint inspect says which), or start a new run "
                "from its weights (rlhf checkpoint export)")


def load_full(engine: Any, weights: dict[str, Any], optimizer_state: dict[str, dict[str, Any]], steps: int) -> None:
    """Every rank: ``weights`` and ``optimizer_state`` (whole tensors by parameter name) into ``engine``'s module
    (the working weights, in its dtype) and its ZeRO optimizer (this rank's partitions, fp32); the engine's step
    counters become ``steps``, as DeepSpeed's own checkpoint load restores them."""
    import deepspeed
    from deepspeed.utils import safe_set_full_fp32_param, safe_set_full_optimizer_state

    if any("momentum_buffer" in per for per in optimizer_state.values()):
        raise CheckpointError(f"the checkpoint was trained with --train.optim muon: {MUON_REFUSAL}")
    if engine.zero_optimization_stage() == 0:
        raise CheckpointError("--ds.zero_stage 0 keeps no ZeRO partitions to load another --train.backend's "
                              "checkpoint into: resume it with --ds.zero_stage 1, 2 or 3")
    module = engine.module
    trained = {name: p for name, p in module.named_parameters() if p.requires_grad}
    unknown = sorted(set(optimizer_state) - set(trained)) or sorted(set(trained) - set(weights))
    if unknown:
        raise CheckpointError(f"the checkpoint's states and this model's trainable parameters differ ({unknown[0]}, "
                              f"{len(unknown)} in all): it was written for another model")
    names = set(module.state_dict())
    with deepspeed.zero.GatheredParameters(list(module.parameters()), modifier_rank=0):  # ZeRO-3: whole, then split
        module.load_state_dict({name: t for name, t in weights.items() if name in names}, strict=False)
    _create_states(engine.optimizer, steps)
    for name, param in trained.items():
        safe_set_full_fp32_param(param, weights[name].float())
        for key, value in optimizer_state.get(name, {}).items():
            safe_set_full_optimizer_state(param, value.float(), key)
    engine.global_steps, engine.global_samples = steps, steps * engine.train_batch_size()


def _create_states(zero: Any, steps: int) -> None:
    """The inner optimizer's states over ZeRO's flat fp32 partitions, made by its own step over each partition alone
    (a zero gradient, every group's learning rate zero; ZeRO-3 also hands its inner optimizer one partition at a
    time), with ``step`` set to ``steps`` in the form it keeps. ZeRO-1/2 then point each parameter at its part of
    them (DeepSpeed does this after its first step)."""
    import torch

    inner = zero.optimizer
    rates = [group["lr"] for group in inner.param_groups]
    for group in inner.param_groups:
        group["lr"] = 0.0
    for group_id, flat in _partitions(zero):
        group, grad = inner.param_groups[group_id], flat.grad
        members, group["params"], flat.grad = group["params"], [flat], torch.zeros_like(flat)
        inner.step()
        group["params"], flat.grad = members, grad  # ZeRO-3 with an offloaded optimizer keeps a gradient buffer here
        state = inner.state[flat]
        if "step" in state:
            state["step"] = torch.full_like(state["step"], steps) if torch.is_tensor(state["step"]) else steps
    for group, rate in zip(inner.param_groups, rates):
        group["lr"] = rate
    link = getattr(zero, "_lazy_init_hp_params_optimizer_state", None)
    if link is not None:
        link()


def _partitions(zero: Any) -> list[tuple[int, Any]]:
    """Each flat fp32 partition this rank keeps, with its inner optimizer group."""
    if hasattr(zero, "bit16_groups"):  # ZeRO-1/2: one partition per parameter group
        return list(enumerate(zero.single_partition_of_fp32_groups))
    return [(zero.sub_group_to_group_id[i], flat)  # ZeRO-3: one per sub-group
            for i, flat in enumerate(zero.fp32_partitioned_groups_flat)]
