"""``--train.enable_ema``: the EMA equals an independently kept average, under ZeRO-3 across ranks too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rlhf_plugin_deepspeed.ema import ParameterEMA

from rlhf.errors import CheckpointError

CHECKS = Path(__file__).parent / "checks"


def test_ema_of_a_plain_module_matches_the_formula(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    module[1].bias.requires_grad_(False)  # frozen parameters are the module's own
    beta = 0.8
    ema = ParameterEMA(module, beta)
    expected = {n: p.detach().clone() for n, p in module.named_parameters()}
    for _ in range(5):
        with torch.no_grad():
            for p in module.parameters():
                p.add_(torch.randn(p.shape, generator=gen))
        ema.update()
        expected = {n: beta * expected[n] + (1 - beta) * p.detach() if p.requires_grad else p.detach().clone()
                    for n, p in module.named_parameters()}
    live = {n: p.detach().clone() for n, p in module.named_parameters()}
    with ema.applied():
        for name, param in module.named_parameters():
            torch.testing.assert_close(param.detach(), expected[name], rtol=0, atol=1e-6)
    assert not torch.equal(expected["0.weight"], live["0.weight"])
    for name, param in module.named_parameters():
        assert torch.equal(param.detach(), live[name])  # the live weights are back
    # a checkpoint round trip, on as many ranks and on more (whole copies: each rank keeps the whole average)
    ema.save(tmp_path / "actor_ema", rank=0, world_size=1)
    for world_size in (1, 2):
        restored = ParameterEMA(module, beta)
        restored.load(tmp_path / "actor_ema", rank=world_size - 1, world_size=world_size)
        assert all(torch.equal(a, b) for a, b in zip(restored.shadow, ema.shadow))
    with pytest.raises(CheckpointError, match="holds 3 trainable tensors and this model has 2"):
        ParameterEMA(torch.nn.Linear(4, 3), beta).load(tmp_path / "actor_ema", rank=0, world_size=1)
    with pytest.raises(CheckpointError, match="has no EMA state"):
        ParameterEMA(module, beta).load(tmp_path / "nothing", rank=0, world_size=1)


@pytest.mark.slow
def test_ema_under_zero3_on_two_ranks_matches_an_independent_ema(tiny_causal_lm_path: Path, tmp_path: Path) -> None:
    """... and the EMA two ZeRO-3 ranks saved resumes on one rank (whole tensors) as the same average."""
    from transformers import AutoModelForCausalLM

    env = {k: v for k, v in os.environ.items() if k not in {"RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"}}
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             str(CHECKS / "ema_zero3.py"), str(tiny_causal_lm_path), "0.6", str(tmp_path)],
                            capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["sharded"]  # each rank held only a shard of every parameter
    assert report["max_difference"] < 1e-6
    assert report["moved_from_live"] > 1e-3  # the average is not the live weights, so the check means something
    assert report["live_restored"]

    model = AutoModelForCausalLM.from_pretrained(tiny_causal_lm_path, dtype=torch.float32)
    ema = ParameterEMA(model, 0.6)
    ema.load(tmp_path / "actor_ema", rank=0, world_size=1)
    averaged = torch.load(tmp_path / "averaged.pt")
    with ema.applied():
        for name, tensor in model.state_dict().items():
            torch.testing.assert_close(tensor, averaged[name], rtol=0, atol=1e-6, msg=name)
