"""Ray actor groups, the controller loop, weight sync and checkpoints."""
