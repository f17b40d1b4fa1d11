"""What a run whose ranks lived in this process leaves behind: the process as it found it."""

from __future__ import annotations

import os

import pytest
import torch

from rlhf.models.loading import seed_process
from rlhf.runtime.cluster.local import in_process_ranks


@pytest.mark.parametrize("before", [False, True], ids=["off-before", "on-before"])
def test_the_environment_threads_and_determinism_are_restored(before: bool, monkeypatch) -> None:
    monkeypatch.setenv("RLHF_TEST_KEPT", "as before")
    torch.use_deterministic_algorithms(before)  # its first call sets torch inductor's cache variable
    environment, threads = dict(os.environ), torch.get_num_threads()  # an earlier in-process run may have left RANK
    try:
        with in_process_ranks():
            seed_process(0, full_determinism=True)  # what --train.full_determinism_enable does on a rank
            os.environ.update(RANK="7", RLHF_TEST_ADDED="by the run", RLHF_TEST_KEPT="changed")
            torch.set_num_threads(1)
            assert torch.are_deterministic_algorithms_enabled()
        assert torch.are_deterministic_algorithms_enabled() is before
        assert dict(os.environ) == environment  # transformers.enable_full_determinism's variables too
        assert torch.get_num_threads() == threads
    finally:
        torch.use_deterministic_algorithms(False)
