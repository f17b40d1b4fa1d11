"""What a run records on disk: atomic checkpoint files and the run directory, metrics and status."""
