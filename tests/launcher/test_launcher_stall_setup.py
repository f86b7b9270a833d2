"""A stall is a stall in any phase: a rank that sleeps after initialize() while its peer waits in a
collective is named after --stall_timeout, not after the set-up allowance (600 s)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from launcher_conftest import SCRIPTS, zerorun_argv

from launcher.watch.heartbeats import Board
from launcher.watch.stall import STALL_EXIT, StallPolicy, peer_missing

SCRIPT = SCRIPTS / "stall_cases.py"


def _board(*beats: dict) -> Board:
    b = Board(len(beats), started_at=0.0)
    b.started(0, "h", {str(r): 100 + r for r in range(len(beats))}, 0.0)
    for r, beat in enumerate(beats):
        b.on_beat(r, beat, 1.0)
    return b


WAITING = {"step": 0, "phase": "backward", "issued": [3, "reduce_scatter", 72, "fp32"], "completed": [2, "x", 1, "f"]}
OUTSIDE = {"step": 0, "phase": "set-up", "issued": [2, "x", 1, "f"], "completed": [2, "x", 1, "f"]}


def test_the_set_up_allowance_is_only_for_ranks_all_outside_collectives() -> None:
    assert StallPolicy(5.0, 600.0).limit(_board(WAITING, OUTSIDE)) == 5.0  # a peer never came: --stall_timeout
    assert StallPolicy(None, 600.0).limit(_board(WAITING, OUTSIDE)) == 60.0  # auto before any step: the floor
    assert StallPolicy(5.0, 600.0).limit(_board(OUTSIDE, OUTSIDE)) == 600.0  # loading, compiling
    assert StallPolicy(5.0, 600.0).limit(_board(WAITING, WAITING)) == 600.0  # all in it: the network's pace
    other = {**WAITING, "issued": [4, "all_gather", 8, "bf16"]}
    assert peer_missing(_board(WAITING, other).alive())  # in different collectives: one never comes
    assert not peer_missing(_board(OUTSIDE, OUTSIDE).alive())


@pytest.mark.timeout(150)
def test_a_rank_asleep_after_initialize_is_named_with_its_line(tmp_path: Path) -> None:
    line = next(i for i, t in enumerate(SCRIPT.read_text().splitlines(), 1) if "# SLEEP_LINE" in t)
    argv = zerorun_argv("--num_gpus", "2", "--master_port", "auto", "--stall_timeout", "3", "--kill_timeout", "3",
                        "--report_json", str(tmp_path / "verdict.json"), "--env", "ZERORUN_SHARED_MEMORY=0",
                        "--env", "ZERORUN_HEARTBEAT_S=0.5", str(SCRIPT), "--sleep_rank", "1", "--sleep_s", "600")
    start = time.monotonic()
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=140)
    took = time.monotonic() - start
    assert proc.returncode == STALL_EXIT, proc.stderr[-3000:]
    report = json.loads((tmp_path / "verdict.json").read_text())
    assert report["culprits"] == [1], report
    assert "rank 1 (localhost) is in " in report["verdict"] and f"stall_cases.py:{line}" in report["verdict"], report
    assert "rank 0 (localhost) waits in reduce_scatter" in report["verdict"], report
    assert took < 120, took  # not the 600 s set-up allowance
