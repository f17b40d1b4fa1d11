"""The ``rlhf`` command line."""
