"""Regenerate the old-API fixture packages from the git history of the `rlhf plugin new` templates.

Each API's packages are written by that commit's own scaffold (its `rlhf.scaffold.write_plugin`, run with the
commit's core on PYTHONPATH), so they are exactly what a user got then: `python regenerate.py` from a clone with
history. COMMITS.md records the commits; the packages are committed as they came out, except where that file says.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
#: plugin API -> (commit whose templates are that API's last, the kinds a third party made from them)
SOURCES = {
    1: ("894dde9", ("reward-function", "advantage-estimator", "agent-executor")),
    2: ("5280158", ("reward-function", "advantage-estimator", "trainer")),
}


def main() -> None:
    for api, (commit, kinds) in SOURCES.items():
        out = HERE / f"api{api}"
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir()
        with tempfile.TemporaryDirectory() as old_core:
            archive = subprocess.run(["git", "-C", str(REPO), "archive", commit, "core/src"], check=True, capture_output=True)
            subprocess.run(["tar", "-x", "-C", old_core], input=archive.stdout, check=True)
            for kind in kinds:
                name = f"api{api}_{kind.replace('-', '_')}"
                subprocess.run([sys.executable, "-c", "import sys, rlhf.scaffold as s; s.write_plugin(sys.argv[1], sys.argv[2], sys.argv[3])",
                                kind, name, str(out)], check=True, env={"PYTHONPATH": f"{old_core}/core/src", "PATH": "/usr/bin:/bin"})


if __name__ == "__main__":
    main()
