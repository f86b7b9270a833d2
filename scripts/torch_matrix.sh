#!/usr/bin/env bash
# Run zerorun's suites on several torch releases: one fresh venv per version, torch from PyPI (the CUDA
# wheels, about 5 GB with their nvidia libraries; they run on the CPU), `pip install -e . torch==V` plus the
# dev extras (pip may not replace torch: a constraints file pins it), then pytest, then one row per version
# in a Markdown table. Each venv is deleted after its row unless --keep.
#
#   scripts/torch_matrix.sh [--keep] [--install-only] [--table FILE] [--subset | --tests "PYTEST ARGS"] [--label L] V...
#
#   --tests   what pytest runs (default: the engine, compat, checkpoint and launcher suites, i.e.
#             tests/engine tests/compat tests/launcher and the two torch-version test files; checkpoint lives
#             under tests/engine/checkpoint).
#   --subset  the representative subset below instead (ZERORUN_MATRIX_SUBSET replaces it).
#   --label   the selection's name written in the table (default: "full" or "custom").
#   --table   where rows are appended (default: $MATRIX_DIR/torch_matrix.md).
#   --keep    keep each venv (and reuse a kept one on the next run).
#   --install-only  build the venvs (implies --keep), run nothing: fetch downloads ahead of the tests.
# The full suites install the dev extras; any other selection only zerorun, pytest, pytest-timeout and
# pytest-xdist (pyproject's addopts run the tests on four workers)
# (MATRIX_EXTRAS=dev installs the extras anyway).
# Environment: MATRIX_DIR (venvs and logs, default ${TMPDIR:-/tmp}/zerorun-torch-matrix), PYTHON
# (default python3), TORCH_WHEEL_DIR (a folder of local torch wheels pip may use first, e.g. a CPU build).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD

FULL="tests/engine tests/compat tests/launcher tests/test_torch_versions.py tests/test_torch_compat.py"
# The representative subset (what ran on the versions between the floor and the newest, and CI's floor
# run): the shim's tests (each private API's private path and fallback), the source test, and the
# seed-style parity runs against one process at world 2: stages 0-2 (fp32/bf16, accumulation, clipping:
# test_engine_parity.py's shared-memory group) and stage 3 (the toy MLP and the tied-embedding GPT, with
# the zero.Init / GatheredParameters / save_16bit_model checks: test_engine_stage3.py's world-2 group).
SUBSET="tests/test_torch_versions.py tests/test_torch_compat.py tests/engine/test_engine_parity.py
tests/engine/test_engine_stage3.py -k 'not world4 and not nccl'"
SUBSET=${ZERORUN_MATRIX_SUBSET:-$SUBSET}

KEEP=0; INSTALL_ONLY=0; TESTS=$FULL; LABEL=""; MATRIX_DIR=${MATRIX_DIR:-${TMPDIR:-/tmp}/zerorun-torch-matrix}
TABLE=""; VERSIONS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --keep) KEEP=1 ;;
        --install-only) INSTALL_ONLY=1; KEEP=1 ;;
        --table) TABLE=$2; shift ;;
        --tests) TESTS=$2; shift ;;
        --subset) TESTS=$SUBSET; LABEL=${LABEL:-subset} ;;
        --label) LABEL=$2; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d'; exit 0 ;;
        -*) echo "torch_matrix: unknown option $1 (see --help)" >&2; exit 2 ;;
        *) VERSIONS+=("$1") ;;
    esac
    shift
done
[ ${#VERSIONS[@]} -gt 0 ] || { echo "torch_matrix: name at least one torch version, e.g. 2.8.0" >&2; exit 2; }
[ -n "$LABEL" ] || { [ "$TESTS" = "$FULL" ] && LABEL=full || LABEL=custom; }
# The full suites need the dev extras (the Hugging Face stack of the compat tests); the subset needs
# only zerorun and its test runner (the dev extras' pins), which installs in a fraction of the time.
if [ "$TESTS" = "$FULL" ] || [ "${MATRIX_EXTRAS:-}" = dev ]; then
    EXTRAS_NAME=dev; EXTRAS='-e .[dev]'
else
    EXTRAS_NAME=lean; EXTRAS="-e . pytest>=9.2,<10 pytest-timeout>=2.4,<3 pytest-xdist>=3.8,<4"
fi
mkdir -p "$MATRIX_DIR"
TABLE=${TABLE:-$MATRIX_DIR/torch_matrix.md}
if [ ! -s "$TABLE" ]; then
    printf '| torch | python | suites | passed | failed | skipped | errors | test minutes | install minutes | note |\n' >"$TABLE"
    printf '|---|---|---|---|---|---|---|---|---|---|\n' >>"$TABLE"
fi

install() {  # $1 version, $2 venv; the log in $2.install.log
    local v=$1 venv=$2 pins
    if [ -f "$venv/.matrix-installed-$EXTRAS_NAME" ] || { [ $EXTRAS_NAME = lean ] && [ -f "$venv/.matrix-installed-dev" ]; }; then
        return 0  # a kept venv of this version with what these tests need
    fi
    rm -rf "$venv"
    "${PYTHON:-python3}" -m venv "$venv"
    # The constraints file pins torch to V for every install below (it also replaces this machine's cap).
    pins=$venv/torch-pin.txt
    echo "torch==$v" >"$pins"
    local links=()
    [ -n "${TORCH_WHEEL_DIR:-}" ] && links=(--find-links "$TORCH_WHEEL_DIR")
    # --no-cache-dir: the wheels are ~5 GB a version; --no-compile: torch's byte-compilation is most of the time.
    PIP_CONSTRAINT=$pins "$venv/bin/python" -m pip install -q --no-cache-dir --no-compile "${links[@]}" "torch==$v"
    # shellcheck disable=SC2086  # EXTRAS is a word list
    PIP_CONSTRAINT=$pins "$venv/bin/python" -m pip install -q --no-compile "${links[@]}" $EXTRAS "torch==$v"
    "$venv/bin/python" -c "import torch, sys; v = torch.__version__.split('+')[0]; sys.exit(v != '$v')" \
        || { echo "torch_matrix: $venv does not hold torch $v" >&2; return 1; }
    touch "$venv/.matrix-installed-$EXTRAS_NAME"
}

PYVER=$("${PYTHON:-python3}" -c 'import platform; print(platform.python_version())')
status=0
for v in "${VERSIONS[@]}"; do
    venv=$MATRIX_DIR/venv-$v${PYTHON:+-py$PYVER}
    log=$MATRIX_DIR/torch-$v.$LABEL.log
    t0=$(date +%s)
    if ! install "$v" "$venv" >"$venv.install.log" 2>&1; then
        tail -5 "$venv.install.log" >&2
        printf '| %s | %s | %s | - | - | - | - | - | %.1f | install failed: %s |\n' "$v" "$PYVER" "$LABEL" \
            "$(echo "($(date +%s) - $t0) / 60" | bc -l)" "$(tail -1 "$venv.install.log" | tr '|' '/' | cut -c1-120)" >>"$TABLE"
        status=1; [ $KEEP = 1 ] || rm -rf "$venv"; continue
    fi
    t1=$(date +%s)
    echo "torch_matrix: torch $v installed in $(( (t1 - t0) / 60 )) min ($venv)"
    [ $INSTALL_ONLY = 1 ] && continue
    eval "args=($TESTS)"  # a word list, quotes respected (-k 'an expression')
    (cd "$ROOT" && timeout "${MATRIX_TIMEOUT:-5400}" "$venv/bin/python" -m pytest -q -p no:cacheprovider "${args[@]}") \
        >"$log" 2>&1 && rc=0 || rc=$?
    t2=$(date +%s)
    summary=$(grep -E '(passed|failed|error|skipped|no tests ran).* in [0-9.]+s' "$log" | tail -1 || true)
    count() { echo "$summary" | grep -Eo "[0-9]+ $1" | grep -Eo '[0-9]+' || echo 0; }
    note="pytest rc=$rc"
    [ -n "$summary" ] || note="$note, no summary (see $log)"
    printf '| %s | %s | %s | %s | %s | %s | %s | %.1f | %.1f | %s |\n' "$v" "$PYVER" "$LABEL" "$(count passed)" "$(count failed)" \
        "$(count skipped)" "$(count 'errors?')" "$(echo "($t2 - $t1) / 60" | bc -l)" \
        "$(echo "($t1 - $t0) / 60" | bc -l)" "$note" >>"$TABLE"
    tail -1 "$TABLE"
    [ "$rc" = 0 ] || { status=1; echo "torch_matrix: torch $v failed; the end of $log:" >&2; tail -40 "$log" >&2; }
    [ $KEEP = 1 ] || rm -rf "$venv"
done
echo "torch_matrix: the table is $TABLE"
exit $status
