"""The CLI process's console (``rlhf.console``): library output of work done in that process goes to the run's
rlhf.log, plain text, and only rlhf's lines reach the console. Run in a fresh interpreter, as ``rlhf`` runs, since
the set-up replaces the process's streams and logging handlers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from rlhf.console import ENV_RUN_LOG, ENV_VERBOSE
from rlhf.testing.cli import child_env

DRIVER = """
import logging, sys
from rlhf.console import attach_run_log, configure_console, library_output_to_run_log
configure_console(verbose=False)
attach_run_log(sys.argv[1])
import torch
from tqdm import tqdm
from rlhf.models.loading import load_value_model

# a critic started from a causal LM: transformers reports its fresh value head in a "LOAD REPORT" table
load_value_model(sys.argv[2], torch.float32, "eager")
# what the driver's Ray prints of a worker, coloured, when it reaches a logger
logging.getLogger("ray").warning("\\x1b[36m(pid=4242)\\x1b[0m a worker's line")
with library_output_to_run_log():  # a rank's call in this process, or rlhf checkpoint export
    for _ in tqdm(range(3), desc="Loading checkpoint shards"):
        pass
    print("\\x1b[1mlibrary print\\x1b[0m")
    logging.getLogger("rlhf.runtime").warning("rlhf's own line, from inside the library work")
print("rlhf's own stdout")
"""


def test_library_output_of_work_in_the_cli_process_goes_plain_to_the_run_log(tiny_causal_lm_path: Path,
                                                                              tmp_path: Path) -> None:
    """The critic's LOAD REPORT (it reached the console through transformers' own stderr handler), tqdm bars and
    prints inside library work (DeepSpeed's universal conversion and zero_to_fp32 print both) go to rlhf.log; colour
    codes (transformers' bold title, Ray's cyan pid prefix) are not written there; rlhf's own lines stay on the
    console, from inside that work too."""
    inherited = {k: v for k, v in child_env().items() if k not in (ENV_RUN_LOG, ENV_VERBOSE)}
    done = subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path / "run"), str(tiny_causal_lm_path)],
                          capture_output=True, text=True, timeout=120, env=inherited)
    assert done.returncode == 0, done.stderr
    assert done.stderr.splitlines() == ["WARNING rlhf.runtime: rlhf's own line, from inside the library work"]
    assert done.stdout == "rlhf's own stdout\n"
    logged = (tmp_path / "run" / "rlhf.log").read_text()
    for line in ("LlamaForSequenceClassification LOAD REPORT from:", "score.weight | MISSING", "(pid=4242) a worker's line",
                 "Loading checkpoint shards: 100%", "library print", "rlhf's own line, from inside the library work"):
        assert line in logged, (line, logged)
    assert "\x1b" not in logged
