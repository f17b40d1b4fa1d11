"""``rlhf.testing.cli.run_in_process`` leaves the test's process as a child run would leave it."""

from __future__ import annotations

import os
from pathlib import Path

from rlhf.testing.cli import assert_ok, run_in_process


def test_variables_a_run_sets_are_gone_and_ones_it_removes_are_back(tmp_path: Path, monkeypatch) -> None:
    """A run sets variables for the libraries it drives (DeepSpeed's ``DS_ACCELERATOR``, vLLM's logging level): a
    later child of the test's process must not inherit them, as it would not from a child run."""
    plugin = tmp_path / "sets_variables.py"
    plugin.write_text("import os\nrlhf_plugin_api = 3\nos.environ['RLHF_KIT_MARK'] = 'set by the run'\nos.environ.pop('RLHF_KIT_GONE', None)\n")
    monkeypatch.delenv("RLHF_KIT_MARK", raising=False)
    monkeypatch.setenv("RLHF_KIT_GONE", "here before the run")
    assert_ok(run_in_process("--plugins", str(plugin), "plugins", "--json"))
    assert "RLHF_KIT_MARK" not in os.environ
    assert os.environ["RLHF_KIT_GONE"] == "here before the run"
