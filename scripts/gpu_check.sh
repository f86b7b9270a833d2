#!/usr/bin/env bash
# The GPU check: the engine on CUDA with NCCL at world size 1 (one GPU, a few minutes).
#
#   bash scripts/gpu_check.sh                  # writes bench/results/gpu_check/<UTC time>/summary.json
#   bash scripts/gpu_check.sh --out DIR        # ... or DIR/summary.json
#   bash scripts/gpu_check.sh --cpu --out DIR  # dry mode: the same code path on CPU/gloo, tiny sizes (CI)
#   bash scripts/gpu_check.sh --dry-run        # every check with its sizes, bounds and time budget; runs nothing
#   bash scripts/gpu_check.sh --peers --out DIR        # beside FSDP2 and DeepSpeed 0.19.8 (bench/gpu_peers.py): 6 minutes
#   bash scripts/gpu_check.sh --peers --cpu --out DIR  # its dry mode: every part tiny on CPU/gloo
#
# Exit status 0 when every check passed, 1 otherwise; each check's figures are in the JSON.
# Stops after 8 minutes at the latest. The checks are listed in bench/gpu_check.py.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}
for arg in "$@"; do
  if [ "$arg" = "--peers" ]; then  # its own parts and budgets; the whole call within 6 minutes
    exec timeout --kill-after=5 360 "$PY" bench/gpu_peers.py "$@"
  fi
done
exec timeout --kill-after=10 480 "$PY" bench/gpu_check.py "$@"
