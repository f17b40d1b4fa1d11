"""HTTP services: ``rlhf serve reward``."""
