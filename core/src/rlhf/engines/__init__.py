"""Training and rollout engines: DeepSpeed strategy, HF model loading, vLLM and HF-generate engines."""
