#!/usr/bin/env bash
# The GPU check: on a machine with one CUDA GPU, one command installs rlhf, runs its GPU paths, each part under its
# own time limit, and writes one results file (default: gpu_check_results.txt in the checkout, or in $OUT if set).
#
#   bash scripts/gpu_check.sh [--results FILE]             # installs from a package index into .venv
#   bash scripts/gpu_check.sh --wheelhouse DIR             # no index: installs DIR's files (scripts/make_wheelhouse.sh)
#   bash scripts/gpu_check.sh --wheelhouse DIR --install-only    # the install step alone (needs no GPU)
#   options: --site DIR (where --wheelhouse installs; default $TMPDIR/rlhf-gpu-site), --extended (the parts below)
#
# --wheelhouse keeps the host's Python and its CUDA torch: DIR's files go into --site with pip --no-index --no-deps
# --target (torch, triton and nvidia-* files in DIR are skipped), and every part runs with --site first on PYTHONPATH.
# The parts, within 8 minutes on one H100 by their limits: install; environment (torch, rlhf doctor); the GRPO step
# side by side (benchmarks/grpo_step.py --device cuda: rlhf, TRL and the raw floor on a 0.5B-shaped model, with
# s/step, start-up and GPU memory, and each rlhf rank's torch.cuda.max_memory_allocated set against `rlhf plan`'s
# peak for its GPU); then, at once on the same GPU, the gpu-marked tests and short GRPO runs with the engine in a
# process of its own (ZeRO-3, FSDP2) on the demo's tiny model. The planned-against-measured lines are gathered at
# the end of the results. --extended adds, past those 8 minutes:
# vLLM rollout against raw vLLM, the weight-sync transports, Liger, flash-attn packing and deepcompile's compile.
# A part that fails or runs out of time is recorded as such and the next one runs.
# Exit status: 0 when every part passed, 1 when one did not, 2 for a usage mistake or no GPU.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
usage_error() { printf 'gpu_check: error: %s\n' "$*" >&2; exit 2; }
results="${OUT:-$repo}/gpu_check_results.txt" wheelhouse="" site="${TMPDIR:-/tmp}/rlhf-gpu-site" install_only=0 extended=0
while [ $# -gt 0 ]; do
  case $1 in
    --wheelhouse|--site|--results) [ $# -ge 2 ] || usage_error "$1 needs a value"
      declare "${1#--}=$2"; shift 2 ;;
    --install-only) install_only=1; shift ;;
    --extended) extended=1; shift ;;
    -h|--help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) usage_error "unknown option $1; bash scripts/gpu_check.sh --help lists them" ;;
    *) results=$1; shift ;;  # the results file, as a plain argument
  esac
done
if [ -n "$wheelhouse" ]; then
  [ -d "$wheelhouse" ] || usage_error "--wheelhouse $wheelhouse: no such folder; build it with scripts/make_wheelhouse.sh"
  wheelhouse=$(cd "$wheelhouse" && pwd)
  compgen -G "$wheelhouse/rlhf_core-*.whl" >/dev/null ||
    usage_error "--wheelhouse $wheelhouse: no rlhf_core wheel in it; build it with bash scripts/make_wheelhouse.sh $wheelhouse"
fi
if [ -n "$wheelhouse" ] && [ -n "$(ls -A "$site" 2>/dev/null)" ] && [ ! -e "$site/.rlhf-gpu-site" ]; then
  usage_error "--site $site: a folder gpu_check.sh did not make (it empties it first); name a new or empty one"
fi
[[ $site == /* ]] || site=$PWD/$site
mkdir -p "$(dirname "$results")"
results=$(cd "$(dirname "$results")" && pwd)/$(basename "$results")
cd "$repo"
: >"$results"
work=$(mktemp -d "${TMPDIR:-/tmp}/rlhf-gpu-check.XXXXXX")
# the parts' scratch (lane logs, benchmark work folders) goes with the check, however it ends
trap 'rm -rf "$work"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
failed=$work/failed
: >"$failed"
say() { printf '%s\n' "$*" | tee -a "$results"; }

# part NAME SECONDS COMMAND...: one part under its time limit; its output and verdict go to $log (the results file
# unless a lane of parallel parts names its own), the verdict to stdout too
log=$results
part() {
  local name=$1 limit=$2 started=$SECONDS status
  shift 2
  printf '== %s (limit %s s)\n' "$name" "$limit" >>"$log"
  timeout --kill-after=10 "$limit" "$@" >>"$log" 2>&1
  status=$?
  local verdict="== $name: exit $status after $((SECONDS - started)) s$([ "$status" -eq 124 ] && echo ' (time limit)')"
  printf '%s\n' "$verdict" >>"$log"
  printf '%s\n' "$verdict"
  [ "$status" -eq 0 ] || printf '%s\n' "$name" >>"$failed"
  return "$status"
}

if [ "$install_only" -eq 0 ] && ! { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }; then
  say "gpu_check: no CUDA GPU here (nvidia-smi finds none); nothing to check (--install-only installs without one)"
  exit 2
fi
say "gpu_check $(date -u +%FT%TZ) on $(hostname)$([ -n "$wheelhouse" ] && echo ", from the wheelhouse $wheelhouse")"
[ "$install_only" -eq 1 ] || nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$results"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PIP_DISABLE_PIP_VERSION_CHECK=1

# From a wheelhouse: the host's interpreter ($PYTHON, default python3) with its own torch; DIR's files in $site.
install_from_wheelhouse() {
  set -e
  local files=() file
  for file in "$wheelhouse"/*.whl "$wheelhouse"/*.tar.gz; do
    [ -e "$file" ] || continue
    case ${file##*/} in
      torch-*|triton-*|nvidia_*) echo "kept the host's own: skipped ${file##*/}" ;;
      *) files+=("$file") ;;
    esac
  done
  rm -rf "$site"
  # --no-deps: the folder holds what the host lacks, the host has the rest (its torch may be older than rlhf-core
  # asks for: pip check below says so). DS_BUILD_OPS=0: DeepSpeed's sdist builds in seconds, its ops JIT-compile later.
  DS_BUILD_OPS=0 "$py" -m pip install --quiet --no-index --find-links "$wheelhouse" --no-deps --no-build-isolation \
    --no-compile --target "$site" "${files[@]}"
  touch "$site/.rlhf-gpu-site"  # marks the folder as this script's to empty next time
  echo "installed ${#files[@]} files into $site"
  # every distribution this folder brought, not rlhf's alone: a library's missing dependency (fastapi 0.165 needs
  # opentelemetry-api) would otherwise show only when the reward server fails to start
  local brought
  brought=$(find "$site" -maxdepth 1 -name '*.dist-info' -printf '%f\n' | sed 's/-[^-]*\.dist-info$//; s/[-_.]\+/[-_.]/g' |
            paste -sd'|')
  echo "requirements of the installed distributions this environment does not meet (pip check; the host's torch may be one):"
  "$py" -m pip check 2>&1 | grep -iE "^($brought) " || echo "  none"
}

# From an index: .venv with the pinned CUDA torch, CUDA vLLM, DeepSpeed, Liger, TRL; flash-attn only where a prebuilt
# wheel installs (a source build takes longer than this whole check).
install_from_index() {
  set -e
  [ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
  "$py" -m pip install --quiet 'torch==2.13.0' 'vllm==0.32.0' deepspeed liger-kernel
  local editables=(-e ./core) plugin
  for plugin in plugins/*/*/; do editables+=(-e "./${plugin%/}"); done
  "$py" -m pip install --quiet --no-deps "${editables[@]}"
  "$py" -m pip install --quiet -e '.[dev,bench]'
  "$py" -m pip install --quiet --only-binary=:all: flash-attn || echo 'flash-attn: no wheel; its part fails'
}

if [ -n "$wheelhouse" ]; then
  py=${PYTHON:-python3}
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PATH="$site/bin:$PATH"
  export -f install_from_wheelhouse && export py site wheelhouse
  part "install" 90 bash -c install_from_wheelhouse
else
  py=.venv/bin/python
  export -f install_from_index && export py
  part "install" 300 bash -c install_from_index
fi
status=$?
# where rlhf imports from, its plugins, torch and CUDA; then rlhf doctor, whose verdict is shown, not counted
environment() {
  set -e
  "$py" -c "
import json, subprocess, sys
import rlhf, torch
plugins = json.loads(subprocess.run([sys.executable, '-m', 'rlhf', 'plugins', '--json'], capture_output=True, text=True,
                                    check=True).stdout)
print('rlhf', rlhf.__version__, 'from', rlhf.__file__)
print(len(plugins), 'plugins,', sum(p['status'] == 'ok' for p in plugins), 'ok')
print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'GPU:', torch.cuda.is_available())"
  "$py" -m rlhf doctor || echo "rlhf doctor: exit $? (a check failed: shown above)"
}
export -f environment
part "environment" 45 bash -c environment || status=1
if [ "$install_only" -eq 1 ]; then
  say "gpu_check: install only, exit $status; results in $results"
  exit "$status"
fi

bench=("$py" benchmarks/grpo_step.py --device cuda --repeats 1 --quiet_wait 0)
part "GRPO step side by side" 165 "${bench[@]}" --steps 6 --warmup 1 --work "$work/side"
tiny=("${bench[@]}" --model_shape demo --systems rlhf-hf --prompts 16 --samples 4 --new_tokens 16 --steps 3 --warmup 0
      --work "$work/tiny")
# the gpu-marked tests keep their own time limits (pytest.mark.timeout); --timeout is for one that names none
mapfile -t gpu_tests < <(grep -rl --include='test_*.py' 'mark\.gpu' tests core/tests plugins | sort)
( log=$work/lane-tests
  part "gpu tests" 180 "$py" -m pytest -m gpu -p no:cacheprovider -p no:xdist -o addopts="-ra --strict-markers \
--import-mode=importlib" --timeout 170 -q -rA "${gpu_tests[@]}" ) &
( log=$work/lane-runs
  part "ZeRO-3 step" 90 "${tiny[@]}" --rlhf_flags "--ds.zero_stage 3"
  part "FSDP2 step" 90 "${tiny[@]}" --rlhf_flags "--train.backend fsdp2" ) &
wait
cat "$work/lane-tests" "$work/lane-runs" >>"$results"

planned=$(grep -h '^planned against measured, ' "$results" | sed 's/^planned against measured, /  /')
say "planned against measured peak GPU memory (rlhf plan's GPU peak, each rank's torch.cuda.max_memory_allocated):"
say "${planned:-  none recorded (no rlhf run finished)}"

if [ "$extended" -eq 1 ]; then
  part "vLLM rollout vs raw vLLM" 200 "${bench[@]}" --systems rlhf-vllm,rlhf-vllm-inproc,raw-vllm --steps 6 --warmup 1 \
    --work "$work/side"
  part "weight-sync transports" 90 "$py" benchmarks/weight_sync.py --repeats 3
  part "Liger on" 75 "${tiny[@]}" --rlhf_flags "--ds.use_liger_kernel"
  part "flash-attn packing" 75 "${tiny[@]}" --rlhf_flags "--ds.packing_samples --ds.attn_implementation flash_attention_2"
  part "deepcompile" 300 "$py" benchmarks/deepcompile.py --work "$work/deepcompile"
fi
if [ -s "$failed" ]; then
  say "gpu_check: done in $SECONDS s; did not pass: $(paste -sd, "$failed" | sed 's/,/, /g'); results in $results"
  exit 1
fi
say "gpu_check: done in $SECONDS s, every part passed; results in $results"
