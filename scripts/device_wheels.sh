#!/usr/bin/env bash
# The wheels a GPU machine without network needs for `scripts/gpu_check.sh --peers`: DeepSpeed 0.19.8
# (built here as a wheel, no ops compiled: they JIT-build on the device where a compiler is there) and
# what it and zerorun import that a CUDA image of torch may lack. Written to .device-wheels/ (ignored
# by git); the device call carries that folder and installs from it with --no-index.
#
#   bash scripts/device_wheels.sh                     # Python 3.10-3.13 wheels of the compiled packages
#   PYVERS="3.12" NUMPY=1 bash scripts/device_wheels.sh   # one Python, numpy too (~17 MB more)
#
# numpy is left out by default (it is ~17 MB a Python version and torch's CUDA images carry it);
# the device run prints whether it is there. The folder must stay under 30 MiB (checked at the end).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${DS_PYTHON:-python3}  # a Python with torch: DeepSpeed's setup.py imports it (--no-build-isolation)
OUT=${OUT:-.device-wheels}
PYVERS=${PYVERS:-"3.10 3.11 3.12 3.13"}
rm -rf "$OUT" && mkdir -p "$OUT"
DS_BUILD_OPS=0 "$PY" -m pip wheel -q --no-deps --no-build-isolation deepspeed==0.19.8 -w "$OUT"
# pure Python (one wheel serves every Python 3)
PURE="hjson py-cpuinfo einops packaging tqdm pydantic==2.14.4 annotated-types typing-extensions
      typing-inspection nvidia-ml-py typer annotated-doc click rich shellingham markdown-it-py mdurl pygments"
# compiled: one wheel per Python version (abi3 / py3-none ones collapse to one file)
COMPILED="pydantic-core==2.50.5 msgpack psutil ninja pyyaml"
"$PY" -m pip download -q --no-deps --only-binary :all: -d "$OUT" $PURE
for v in $PYVERS; do
  "$PY" -m pip download -q --no-deps --only-binary :all: --platform manylinux2014_x86_64 \
      --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --python-version "$v" \
      --implementation cp -d "$OUT" $COMPILED
  if [ -n "${NUMPY:-}" ]; then
    "$PY" -m pip download -q --no-deps --only-binary :all: --platform manylinux_2_28_x86_64 \
        --platform manylinux2014_x86_64 --python-version "$v" --implementation cp -d "$OUT" "numpy<2.4"
  fi
done
size=$(du -sm "$OUT" | cut -f1)
ls -1 "$OUT"
echo "$OUT: $(ls "$OUT" | wc -l) wheels, ${size} MiB"
[ "$size" -le 30 ] || { echo "error: $OUT is ${size} MiB, over the 30 MiB a device call carries" >&2; exit 1; }
