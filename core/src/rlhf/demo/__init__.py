"""``rlhf demo``: SFT then GRPO on a tiny addition task, end to end on a CPU."""
