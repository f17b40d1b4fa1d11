"""--ds.ring_attn_size: a clear error on CPU machines; on GPUs the ring gives the unsplit hidden states."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from rlhf_plugin_ring_attn.ring import RingAttention

from rlhf.errors import ConfigError
from rlhf.testing.conformance import ppo_config


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU-machine error")
def test_cpu_machine_gets_an_error_naming_the_flag() -> None:
    config = ppo_config()
    config.ds.ring_attn_size = 2
    with pytest.raises(ConfigError, match=r"--ds.ring_attn_size 2: ring attention .* no CUDA GPU .* --ds.ring_attn_size 1"):
        RingAttention().prepare("actor", config)


def test_a_ring_of_one_changes_nothing() -> None:
    extension = RingAttention()
    extension.prepare("actor", ppo_config())
    model = torch.nn.Linear(2, 2)
    assert extension.wrap(model, "actor", ppo_config()) is model


RING_CHECK = '''
import sys, torch, torch.distributed as dist
from transformers import AutoModelForCausalLM
from rlhf_plugin_ring_attn.ring import RingAttention
from rlhf.testing.conformance import ppo_config
from rlhf.runtime.workers.batch import pack
dist.init_process_group("nccl"); rank = dist.get_rank(); torch.cuda.set_device(rank)
config = ppo_config(); config.ds.ring_attn_size = 2
gen = torch.Generator().manual_seed(rank)
prompts = [torch.randint(10, 300, (n,), generator=gen).tolist() for n in (7, 19, 4)]
batch = pack(prompts, [[11, 12, 13]] * 3, 0, packed=True)
load = lambda: AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16,
                                                     attn_implementation="flash_attention_2").cuda()
plain = load()
with torch.no_grad():
    want = plain(**{k: v.cuda() if hasattr(v, "cuda") else v for k, v in batch.model_inputs().items()}).logits
ring = RingAttention(); ring.prepare("actor", config); model = ring.wrap(load(), "actor", config)
with torch.no_grad():
    got = model(**{k: v.cuda() if hasattr(v, "cuda") else v for k, v in batch.model_inputs().items()}).logits
torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=2e-2)
print("ok", rank)
'''


@pytest.mark.gpu
@pytest.mark.timeout(150)  # two ranks load a tiny model twice each; the subprocess's own limit is below it
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_ring_of_two_gives_each_rank_its_unsplit_logits(tiny_causal_lm_path: Path, tmp_path: Path) -> None:
    script = tmp_path / "ring_check.py"
    script.write_text(RING_CHECK)
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                             str(script), str(tiny_causal_lm_path)], capture_output=True, text=True, timeout=140,
                            env=dict(os.environ))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "ok 0" in result.stdout and "ok 1" in result.stdout
