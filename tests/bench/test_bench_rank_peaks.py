"""bench/rank_peaks.py: the peak resident memory of each rank of a launched job, and of nothing else."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from rank_peaks import RankPeaks  # noqa: E402

MiB = 2**20
# The rank touches (RANK + 1) * 64 MiB, holds it a moment, frees it and exits; its launcher, which names
# the script too but has no RANK of its own, touches 256 MiB first, so counting it would show.
JOB = """
import os, sys, time
if "RANK" not in os.environ:
    hog = b"x" * (256 * 2**20)
    procs = [subprocess.Popen([sys.executable, __file__], env={**os.environ, "RANK": str(r)}) for r in (0, 1)]
    sys.exit(max(p.wait() for p in procs))
block = b"x" * ((int(os.environ["RANK"]) + 1) * 64 * 2**20)
time.sleep(1.0)
del block
"""


@pytest.mark.timeout(60)
def test_peaks_are_the_ranks_own(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text("import subprocess\n" + JOB)
    proc = subprocess.Popen([sys.executable, str(script)])
    peaks = RankPeaks(proc.pid, "job.py", interval=0.05)
    peaks.start()
    assert proc.wait(timeout=30) == 0
    peaks.stop()
    got = peaks.peaks()
    assert set(got) == {0, 1}
    for rank, peak in got.items():
        block = (rank + 1) * 64 * MiB
        assert block < peak < block + 64 * MiB, (rank, peak / MiB)  # the block plus an interpreter's few MiB
