#!/usr/bin/env bash
# The main job's set-up: a virtual environment `.venv` (or $ZERORUN_VENV) holding the CPU
# build of torch and zerorun (editable) with its runtime dependencies only. No root, no
# apt, no dev extras; the tests' set-up is scripts/setup-tests.sh. Safe to run again.
#   bash scripts/setup.sh && .venv/bin/zerorun --num_gpus 2 examples/train_toy.py --config templates/zero2.yaml
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${ZERORUN_VENV:-.venv}
TORCH=${ZERORUN_TORCH:-torch==2.13.0}
[ -x "$VENV/bin/python" ] || "${PYTHON:-python3}" -m venv "$VENV"
# --no-compile: pip would byte-compile every one of torch's files up front (3/4 of the install's
# time); Python compiles the few a run imports on first use instead.
"$VENV/bin/python" -m pip install -q --no-compile "$TORCH"
"$VENV/bin/python" -m pip install -q --no-compile -e .
echo "zerorun: installed into $VENV (run $VENV/bin/zerorun, or source $VENV/bin/activate)"
