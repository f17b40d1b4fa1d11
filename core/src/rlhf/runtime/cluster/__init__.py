"""The Ray cluster a run uses: start-up and shutdown, the session watchdog, placement of ranks and engines."""
