"""``rlhf lora merge``: the command's flags (OpenRLHF ``lora_combiner``'s, as they are), and the merge."""

from __future__ import annotations

import argparse
from typing import Any, ClassVar


class LoraCommand:
    """LoRA adapter tools: ``rlhf lora merge`` folds an adapter into its base model."""

    help: ClassVar[str] = "LoRA adapter tools: rlhf lora merge …"

    @classmethod
    def add_arguments(cls, parser: Any) -> None:
        actions = parser.add_subparsers(dest="lora_command", metavar="ACTION", required=True)
        merge = actions.add_parser("merge", help="merge an adapter into its base model and save a plain HF model",
                                   formatter_class=argparse.ArgumentDefaultsHelpFormatter)
        merge.add_argument("--model_path", required=True, help="the base model the adapter was trained on")
        merge.add_argument("--lora_path", required=True, help="the adapter dir (adapter_config.json, adapter weights)")
        merge.add_argument("--output_path", required=True, help="where the merged model is written")
        merge.add_argument("--is_rm", action="store_true", help="the adapter belongs to a reward model (value head)")
        merge.add_argument("--param_dtype", "--ds.param_dtype", dest="param_dtype", choices=["bf16", "fp16", "fp32"],
                           default="bf16", help="dtype the base model is loaded in and the merged weights are saved in "
                           "(--ds.param_dtype: OpenRLHF 0.11 lora_combiner's spelling)")
        merge.add_argument("--bf16", dest="param_dtype", action="store_const", const="bf16",
                           help="OpenRLHF lora_combiner's spelling of --param_dtype bf16")

    def run(self, host: Any, args: Any) -> int:
        from rlhf_plugin_lora_merge.merge import merge_adapter

        out = merge_adapter(args.model_path, args.lora_path, args.output_path, is_rm=args.is_rm, dtype=args.param_dtype)
        print(f"merged {args.lora_path} into {args.model_path}: {out}")
        return 0
