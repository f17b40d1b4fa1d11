"""Issue 61: a run on a backend other than DeepSpeed never loads it, not even to write the final HF model
(transformers' ``save_pretrained`` unwraps through accelerate, which imported ``deepspeed`` to ask about its engine)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rlhf.testing.cli import child_env

SAVE = """
import sys
import torch
from transformers import AutoModelForCausalLM
from rlhf.models.saving import without_deepspeed_import

model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
with without_deepspeed_import():
    model.save_pretrained(sys.argv[2])
print("deepspeed imported:", "deepspeed" in sys.modules)
again = AutoModelForCausalLM.from_pretrained(sys.argv[2])
print("same weights:", all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), again.state_dict().values())))
model.save_pretrained(sys.argv[2] + "-plain")  # without the guard, as before: accelerate imports it
print("plain save imports it:", "deepspeed" in sys.modules)
"""


def test_a_model_is_saved_without_importing_deepspeed(tiny_causal_lm_path: Path, tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-c", SAVE, str(tiny_causal_lm_path), str(tmp_path / "saved")],
                            capture_output=True, text=True, timeout=300, env=child_env())
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in result.stdout.splitlines() if ": " in line and not line.startswith("[")]
    assert lines == ["deepspeed imported: False", "same weights: True", "plain save imports it: True"], result.stdout
