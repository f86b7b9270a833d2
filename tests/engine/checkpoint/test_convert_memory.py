"""`zerorun convert --to hf` streams: a checkpoint 10x the shard size converts within 3x the shard size.

Two fresh processes (bench/convert_memory.py): one saves a world-1 checkpoint of ~25.2M fp32
parameters (100 MB, 192 tensors of at most 1 MiB), the other converts it to 10 MB shards and
reports its ``VmHWM`` during the conversion over its ``VmRSS`` just before (the peak is reset
through ``/proc/self/clear_refs``). Holding the model would peak at 100 MB; the streaming
holds at most a shard's worth of source pages, the largest tensor and a fixed few MB of
first-use allocations (measured 11-22 MB at 5-20 MB shards, BENCHMARKS.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
SCRIPT = REPO / "bench" / "convert_memory.py"


def _run(*args: str) -> dict[str, float]:
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=240,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_hf_convert_peaks_below_three_shards(tmp_path: Path) -> None:
    _run("make", str(tmp_path / "ck"), "--params", "25.2e6", "--width", "512")
    got = _run("convert", str(tmp_path / "ck"), str(tmp_path / "hf"), "--max_shard_size", "10MB")
    assert got["checkpoint_over_shard"] >= 10 and got["files"] >= 10, got
    assert got["peak_over_start"] < 3 * got["max_shard_size"], got
