#!/usr/bin/env bash
# The oldest torch and transformers that rlhf-core and its plugins declare, checked for real:
#
#   bash scripts/check_floors.sh [VENV] [-- PYTEST_ARGS...]     # VENV default: $TMPDIR/rlhf-floors
#
# Builds a side venv with the floors rlhf-core and the plugins declare (torch from the package index: PyPI's build runs on
# a CPU without a GPU), installs rlhf-core and every first-party plugin into it without the vLLM extra (a vllm
# release pins its own torch), then runs the fast tier there; PYTEST_ARGS replace the fast tier's selection.
# scripts/install.sh's venv is untouched. Exit status: pytest's, or 2 for a usage mistake.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
venv=${TMPDIR:-/tmp}/rlhf-floors pytest_args=(-m "not slow")
while [ $# -gt 0 ]; do
  case $1 in
    --) shift; pytest_args=("$@"); break ;;
    -h|--help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) printf 'check_floors: error: unknown option %s; bash scripts/check_floors.sh --help lists them\n' "$1" >&2; exit 2 ;;
    *) venv=$1; shift ;;
  esac
done
cd "$repo"
py=${PYTHON:-python3.11}
# "torch==2.11", "transformers==5.18": the highest lower bound that rlhf-core or any plugin declares for each
floors=$("$py" - <<'EOF'
import glob, tomllib
from packaging.requirements import Requirement
from packaging.version import Version
floors = {}
for path in ["core/pyproject.toml", *sorted(glob.glob("plugins/*/*/pyproject.toml"))]:
    for line in tomllib.load(open(path, "rb"))["project"].get("dependencies", []):
        r = Requirement(line)
        if r.name in ("torch", "transformers"):
            (floor,) = [s.version for s in r.specifier if s.operator == ">="]
            floors[r.name] = max(floors.get(r.name, floor), floor, key=Version)
print("\n".join(f"{name}=={floor}" for name, floor in sorted(floors.items())))
EOF
)
[ -x "$venv/bin/python" ] || "$py" -m venv "$venv"
constraints=$venv/floors.txt
printf '%s\n' $floors >"$constraints"
echo "check_floors: $(paste -sd' ' "$constraints") in $venv"
export PIP_DISABLE_PIP_VERSION_CHECK=1
pip_install() { "$venv/bin/python" -m pip install --quiet --constraint "$constraints" "$@"; }
# shellcheck disable=SC2046
pip_install $(cat "$constraints")
editables=(-e ./core)
for plugin in plugins/*/*/; do  # with a plugin's own test extra, where it has one (the openai client)
  if grep -q '^test = ' "$plugin/pyproject.toml"; then editables+=(-e "./${plugin%/}[test]"); else editables+=(-e "./${plugin%/}"); fi
done
pip_install "${editables[@]}" -e ".[dev]"
"$venv/bin/python" -c "import torch, transformers; print('check_floors: torch', torch.__version__, 'transformers', transformers.__version__)"
exec "$venv/bin/python" -m pytest -p no:cacheprovider "${pytest_args[@]}"
