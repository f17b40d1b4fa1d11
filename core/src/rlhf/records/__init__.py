"""What a run records on disk: atomic checkpoint files and the run directory, the best-checkpoint record, metrics and status."""
