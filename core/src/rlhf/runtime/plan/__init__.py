"""``rlhf plan``'s placement per GPU, memory totals, verdict and first fitting change (docs/plan.md)."""
