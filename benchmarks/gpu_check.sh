#!/usr/bin/env bash
# The GPU check (see benchmarks/gpu_check.py), the one command to run on a lent GPU machine; arguments pass through:
#   bash benchmarks/gpu_check.sh                 # on one GPU: every section, under 8 minutes
#   bash benchmarks/gpu_check.sh --dry-run       # on a CPU (also what it does where torch sees no CUDA)
# Python: $PYTHON if set, else the project's .venv, else python3 on PATH. dapo_rl is imported from src/. Where
# omegaconf is missing, the wheels carried in benchmarks/wheels/ (see gpu_check.py's docstring) are installed into a
# temporary folder first, without network or dependencies.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
if [[ -n "${PYTHON:-}" ]]; then
  py="$PYTHON"
elif [[ -x "$root/.venv/bin/python" ]]; then
  py="$root/.venv/bin/python"
else
  py="$(command -v python3 || true)"
  if [[ -z "$py" ]]; then
    echo "gpu_check.sh: no $root/.venv/bin/python and no python3 on PATH (set PYTHON=...)" >&2
    exit 1
  fi
fi
cd "$root"
export PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}"
if ! "$py" -c "import omegaconf" 2>/dev/null; then
  shopt -s nullglob
  wheels=("$root"/benchmarks/wheels/*.whl)
  if ((${#wheels[@]} == 0)); then
    echo "gpu_check.sh: omegaconf is missing and benchmarks/wheels/ holds no wheel (see benchmarks/gpu_check.py)" >&2
    exit 1
  fi
  site="${TMPDIR:-/tmp}/dapo_gpu_check_site"
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "${wheels[@]}"
  export PYTHONPATH="$site:$PYTHONPATH"
  echo "gpu_check.sh: installed ${wheels[*]##*/} into $site" >&2
fi
export PYTHONUNBUFFERED=1
exec "$py" benchmarks/gpu_check.py "$@"
