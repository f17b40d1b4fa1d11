"""Settings for every test of the repository, made before the test workers start (they inherit them)."""

import os

# Two xdist workers on two cores, each test's ranks and engines with their own OpenMP pools: the machine is always
# oversubscribed, and OpenMP's default of spinning at every barrier then burns the time slices the other processes
# need. The HF VLM run of tests/test_vlm_e2e.py took 14 s alone, 132 s beside three busy processes, and 44 s beside
# them with passive waiting. Thread counts stay as rlhf sets them, so the tests of its core shares still hold.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
