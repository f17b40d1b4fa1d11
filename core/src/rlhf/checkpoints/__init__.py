"""What a run writes to disk and reads back: atomic checkpoint files and the run directory (files), and the best-checkpoint record (best)."""
