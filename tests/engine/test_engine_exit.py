"""A finished run exits 0, every time: no rank aborts at interpreter exit after training finished.

A C++ thread that needs the GIL once the interpreter finalizes aborts the rank ("terminate called
without an active exception", exit -6); gloo's worker threads are such threads. Run as a benchmark
runs them: plain DDP, then zerorun at stages 1, 2 and 3, round after round (32 world-2 runs, each rank
its own process exiting through the interpreter's finalization, :mod:`tests.engine.exit_rounds`),
ending in each of a script's ways (nothing, ``engine.destroy()``, the script's own
``destroy_process_group``), on a group zerorun created or the script's own; then the README's main
job under the launcher. Every rank exits 0 and none prints "terminate called"; a rank whose group
zerorun created finalizes with no thread but its own left (so none can abort it), which without the
engine's exit path (:mod:`zerorun.engine.teardown`) holds gloo's three and fails here every time.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 8  # x (ddp, z1, z2, z3) = 32 runs of 2 ranks


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "ZERORUN_HEARTBEAT_S": "0.2",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


@pytest.mark.timeout(800)  # ~95 s of CPU; minutes on a machine shared with other jobs
def test_rounds_of_ddp_and_every_stage_exit_0_with_no_thread_left() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "tests/engine/exit_rounds.py"), "--rounds", str(ROUNDS)],
                          capture_output=True, text=True, timeout=780, env=_env(), cwd=ROOT)
    records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    assert proc.returncode == 0 and len(records) == 2 * 4 * ROUNDS, proc.stderr[-3000:]
    bad = [r for r in records if r["exit"] != 0 or r["terminate"]]
    assert not bad, f"{len(bad)} of {len(records)} rank exits failed: " + "\n".join(map(json.dumps, bad[:4]))
    own = [r for r in records if r["system"] != "ddp" and not r["user_group"]]
    assert own and all(r["threads"] is not None for r in records)
    left = [r for r in own if len(r["threads"]) != 1]
    assert not left, "threads alive when the interpreter finalized: " + "\n".join(map(json.dumps, left[:4]))


@pytest.mark.timeout(300)
def test_the_readme_job_under_the_launcher_exits_0_twice() -> None:
    cmd = [sys.executable, "-m", "zerorun.cli", "--num_gpus", "2", "--master_port", "auto",
           str(ROOT / "examples/train_toy.py"), "--config", str(ROOT / "templates/zero2.yaml"), "--steps", "3"]
    for attempt in range(2):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280, env=_env(), cwd=ROOT)
        out = proc.stdout + proc.stderr
        assert proc.returncode == 0 and "terminate called" not in out, f"attempt {attempt}: {out[-3000:]}"
