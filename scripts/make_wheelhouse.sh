#!/usr/bin/env bash
# Build a wheelhouse for `scripts/gpu_check.sh --wheelhouse DIR`, on a machine that reaches a package index:
#
#   bash scripts/make_wheelhouse.sh DIR [-r REQUIREMENTS]... [--no-default] [--python-version X.Y] [--platform TAG]...
#
# DIR gets this checkout's wheels (rlhf-core, every plugins/*/* distribution and the `rlhf` meta-distribution) and
# what the GPU host's image lacks: the distributions of scripts/gpu_wheelhouse.txt (what a torch + CUDA image lacked;
# --no-default leaves it out) and of every -r file. Each comes as a wheel for the host's Python and platform (default:
# this Python's version; manylinux x86_64, or the --platform tags, e.g. manylinux_2_28_aarch64), else as its sdist
# (DeepSpeed publishes none but an sdist; gpu_check.sh builds it on the host). Dependencies are not followed
# (--no-deps): the lists name everything to bring, so nothing the host has already, torch first, is fetched again.
# Building rlhf's own wheels needs setuptools>=77 here (--no-build-isolation). Copy DIR and this checkout to the host.
set -euo pipefail
usage_error() { printf 'make_wheelhouse: error: %s\n' "$*" >&2; exit 2; }
repo=$(cd "$(dirname "$0")/.." && pwd)
py=${PYTHON:-python3}
lists=("$repo/scripts/gpu_wheelhouse.txt") dir="" python_version="" platforms=()
while [ $# -gt 0 ]; do
  case $1 in
    -r|--requirements) [ $# -ge 2 ] && [ -f "$2" ] || usage_error "$1 ${2:-}: no such requirements file"
      lists+=("$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"); shift 2 ;;
    --no-default) lists=("${lists[@]:1}"); shift ;;
    --python-version) [ $# -ge 2 ] || usage_error "--python-version needs a value, e.g. 3.12"; python_version=$2; shift 2 ;;
    --platform) [ $# -ge 2 ] || usage_error "--platform needs a tag, e.g. manylinux_2_28_x86_64"; platforms+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,/^set /p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) usage_error "unknown option $1; bash scripts/make_wheelhouse.sh --help lists them" ;;
    *) [ -z "$dir" ] || usage_error "one folder only (got $dir and $1)"; dir=$1; shift ;;
  esac
done
[ -n "$dir" ] || usage_error "name the folder to fill: bash scripts/make_wheelhouse.sh DIR"
mkdir -p "$dir" && dir=$(cd "$dir" && pwd)
[ -n "$python_version" ] || python_version=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ ${#platforms[@]} -gt 0 ] || platforms=(manylinux_2_28_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64)
target=(--only-binary=:all: --implementation cp --python-version "$python_version")
for platform in "${platforms[@]}"; do target+=(--platform "$platform"); done

echo "rlhf's own wheels, from $repo"
(cd "$repo" && "$py" -m pip wheel --quiet --no-deps --no-build-isolation -w "$dir" ./core plugins/*/*/ .)
# the lists' requirements, one a line; comments and blank lines dropped
requirements=()
for list in ${lists[@]+"${lists[@]}"}; do
  while IFS= read -r line || [ -n "$line" ]; do
    line=${line%%#*}
    line=${line//[[:space:]]/}
    [ -z "$line" ] || requirements+=("$line")
  done <"$list"
done
for requirement in ${requirements[@]+"${requirements[@]}"}; do
  if ! "$py" -m pip download --quiet --no-deps "${target[@]}" -d "$dir" "$requirement" 2>/dev/null; then
    echo "no wheel of '$requirement' for Python $python_version on ${platforms[*]}: its sdist"
    "$py" -m pip download --quiet --no-deps --no-binary=:all: -d "$dir" "$requirement" ||
      { echo "make_wheelhouse: error: '$requirement': neither a wheel nor an sdist found; fix its line" >&2; exit 1; }
  fi
done
echo "$dir: $(find "$dir" -maxdepth 1 -name 'rlhf*.whl' | wc -l) rlhf wheels, ${#requirements[@]} more distributions, $(du -sh "$dir" | cut -f1)"
echo "on the GPU host, from this checkout: bash scripts/gpu_check.sh --wheelhouse $dir"
