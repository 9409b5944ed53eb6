#!/usr/bin/env bash
# The GPU check (see benchmarks/gpu_check.py): run it whenever a GPU machine is lent. Arguments pass through:
#   bash benchmarks/gpu_check.sh                 # one GPU
#   bash benchmarks/gpu_check.sh --nproc 2       # FSDP2 over NCCL, vLLM external_launcher
# Python: $PYTHON if set, else the project's .venv, else python3 on PATH. Without CUDA it prints one line, exits 0.
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
  echo "gpu_check.sh: no $root/.venv; using $py" >&2
fi
cd "$root"
exec "$py" benchmarks/gpu_check.py "$@"
