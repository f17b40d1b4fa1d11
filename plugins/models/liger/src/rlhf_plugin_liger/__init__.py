"""``--ds.use_liger_kernel``: Liger's Triton kernels in the actor, reference, critic and reward model.

After a model loads (and before LoRA wraps it into DeepSpeed), Liger patches the instance's
RMSNorm, rotary embedding and SwiGLU MLP modules with its fused kernels; the numbers stay those
of the HF model. GPU only (Triton): on a machine without CUDA the run stops at worker start with
an error naming the flag. ``pip install rlhf-plugin-liger[gpu]`` brings ``liger-kernel``.
"""

import rlhf

rlhf_plugin_api = 3  # the lowest plugin API this plugin needs (docs/plugin-api.md)


@rlhf.hookimpl
def rlhf_register_model_loaders(register):
    register("liger", "rlhf_plugin_liger.kernels:Liger", description="Liger Triton kernels (--ds.use_liger_kernel, GPU)")
