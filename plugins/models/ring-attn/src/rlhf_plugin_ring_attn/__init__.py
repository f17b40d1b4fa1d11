"""``--ds.ring_attn_size N`` (and ``--ds.ring_attn_head_stride``): ring attention over groups of N ranks.

Consecutive ranks of a model group form ring groups of N. In every forward the ranks of a ring
group join their packed rows (``--ds.packing_samples``, which the flag turns on) into one, each
runs the model on its 1/N slice with ring-flash-attn's varlen attention (keys and values travel
round the ring, ``head_stride`` heads at a time), and the hidden states are all-gathered (with
gradients) so every rank reads its own samples as usual. The gradients summed over a ring group
are those of the sum of its ranks' losses, so data parallelism and the step normalisers are
unchanged; what shrinks is each rank's attention work and activation memory on long sequences.
GPU only (flash-attn): on a machine without CUDA the run stops at worker start with an error
naming the flag. ``pip install rlhf-plugin-ring-attn[gpu]`` brings ring-flash-attn and flash-attn.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_model_loaders(register):
    register("ring-attn", "rlhf_plugin_ring_attn.ring:RingAttention",
             description="ring attention across ranks for long packed rows (--ds.ring_attn_size, GPU)")
