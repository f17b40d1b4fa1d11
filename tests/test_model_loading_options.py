"""``--ds.experts_implementation`` reaches the models the trainers load."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def tiny_moe_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch
    from transformers import MixtralConfig, MixtralForCausalLM

    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("tiny-moe")
    config = MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                           num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2)
    MixtralForCausalLM(config).save_pretrained(path)
    return path


@pytest.mark.parametrize("implementation", ["eager", "batched_mm"])
def test_the_trained_and_frozen_models_use_the_chosen_experts_implementation(tiny_moe_path: Path, implementation: str) -> None:
    from rlhf_supervised.config import SupervisedConfig
    from rlhf_supervised.models import load_trained

    from rlhf.models.loading import load_value_model

    config = SupervisedConfig()
    config.model.model_name_or_path = str(tiny_moe_path)
    config.ds.param_dtype, config.ds.attn_implementation = "fp32", "eager"
    config.ds.experts_implementation = implementation
    assert load_trained(config, value_head=None).config._experts_implementation == implementation
    critic = load_value_model(str(tiny_moe_path), None, "eager", experts=implementation)
    assert critic.config._experts_implementation == implementation
    default = load_value_model(str(tiny_moe_path), None, "eager")  # unset: transformers' own choice
    assert default.config._experts_implementation != "batched_mm"


@pytest.mark.slow
def test_local_rank_sets_the_device_index_when_the_launcher_did_not() -> None:
    import os
    import subprocess
    import sys

    program = ("import os; from rlhf_supervised.models import join_process_group; "
               "from rlhf_supervised.config import SupervisedConfig; "
               "from rlhf_plugin_deepspeed.backend import DeepSpeedBackend; "
               "print(join_process_group(DeepSpeedBackend(SupervisedConfig()), {}), os.environ['LOCAL_RANK'])")
    env = {k: v for k, v in os.environ.items() if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}}
    for local_rank, launcher_env, expected in ((1, {}, "1"), (-1, {}, "0"), (1, {"LOCAL_RANK": "0"}, "0")):
        result = subprocess.run([sys.executable, "-c", program.format(local_rank)], capture_output=True, text=True,
                                env={**env, **launcher_env}, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.split()[-1] == expected and "(0, 1)" in result.stdout
