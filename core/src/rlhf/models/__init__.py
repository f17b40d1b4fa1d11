"""Model loading for every trainer: Hugging Face models and value heads, LoRA, the registered model extensions, and the choice of training backend."""
