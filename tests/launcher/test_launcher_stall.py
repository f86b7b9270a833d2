"""Hangs and stragglers named by the launcher, on 3 real gloo ranks (tests/launcher_scripts/stall_cases.py).

(a) a rank skips a collective in a data-dependent branch: the verdict names it and the
collective its peers wait in, within the stall timeout + 15 s; (b) a rank spins in its own
loop: its file:line is named; (c) a rank sleeps 3x the step time every step: a straggler,
the run still ends with 0; (d) a slow first step and a slow checkpoint save raise no stall.
The shared-memory lane is off (ZERORUN_SHARED_MEMORY=0): across hosts there is none, and
it would name a mismatch itself before the launcher does.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from launcher_conftest import SCRIPTS, zerorun_argv

from launcher.stall import STALL_EXIT

SCRIPT = str(SCRIPTS / "stall_cases.py")
STALL_S = 3


def _launch(tmp_path: Path, *args: str, timeout: float = 90) -> tuple[subprocess.CompletedProcess[str], float]:
    start = time.monotonic()
    argv = zerorun_argv("--num_gpus", "3", "--master_port", "auto", "--quiet", "--stall_timeout", str(STALL_S),
                        "--report_json", str(tmp_path / "verdict.json"), "--log_dir", str(tmp_path / "logs"),
                        "--env", "ZERORUN_SHARED_MEMORY=0", "--env", "ZERORUN_HEARTBEAT_S=0.5", SCRIPT, *args)
    proc = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=timeout)
    return proc, time.monotonic() - start


@pytest.mark.timeout(120)
def test_a_skipped_collective_names_the_rank_and_what_the_others_wait_in(tmp_path: Path) -> None:
    proc, wall = _launch(tmp_path, "--mode", "skip")
    assert proc.returncode == STALL_EXIT, proc.stderr[-3000:]
    report = json.loads((tmp_path / "verdict.json").read_text())
    assert report["culprits"] == [2], report["verdict"]
    text = report["verdict"]
    assert text.startswith("stalled: rank 2 (localhost) waits in all_reduce #"), text
    assert "ranks 0,1 wait in reduce_scatter #" in text and "stall_cases.py:" in text, text
    waiting = next(g for g in report["groups"] if g["ranks"] == [0, 1])
    assert waiting["collective"]["kind"] == "reduce_scatter" and waiting["phase"] == "backward"
    assert any("stall_cases.py" in line for line in report["stacks"]["2"])
    assert f"zerorun: {text}" in proc.stderr and "exit code 124" in proc.stderr  # the verdict and the summary
    stacks = list((tmp_path / "logs").glob("stall-stacks-*.txt"))
    assert stacks and "==== rank 2" in stacks[0].read_text()
    # the job ran 3 steps (~1 s) after its set-up: the verdict came well within the timeout + 15 s
    assert wall < 45 + STALL_S + 15, wall


@pytest.mark.timeout(120)
def test_a_rank_spinning_in_its_own_loop_is_named_at_its_line(tmp_path: Path) -> None:
    proc, _ = _launch(tmp_path, "--mode", "spin")
    assert proc.returncode == STALL_EXIT, proc.stderr[-3000:]
    spin_line = next(i for i, line in enumerate(Path(SCRIPT).read_text().splitlines(), 1) if "SPIN_LINE" in line)
    report = json.loads((tmp_path / "verdict.json").read_text())
    assert report["culprits"] == [1], report["verdict"]
    assert report["verdict"].startswith(f"stalled: rank 1 (localhost) is in script at stall_cases.py:{spin_line + 1}"), report["verdict"]
    assert "ranks 0,2 wait in " in report["verdict"]


@pytest.mark.timeout(150)
def test_a_straggler_is_named_and_slow_set_up_and_saves_are_no_stall(tmp_path: Path) -> None:
    # step ~0.1 s; rank 2 sleeps 0.3 s more each step; the first step and the save each take 2.5x the stall timeout
    proc, _ = _launch(tmp_path, "--mode", "healthy", "--steps", "10", "--slow_rank", "2", "--slow_s", "0.3",
                      "--first_step_s", str(2.5 * STALL_S), "--save_s", str(2.5 * STALL_S),
                      "--save_dir", str(tmp_path / "ckpt"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "stalled" not in proc.stderr and not (tmp_path / "verdict.json").exists()
    assert proc.stdout.count("done") == 3 and (tmp_path / "ckpt" / "latest").exists()
    assert "zerorun: rank 2 (localhost) is a straggler" in proc.stderr  # in the log as it happens
    summary = proc.stderr[proc.stderr.index("run summary"):]
    assert "3 rank(s) on 1 node(s)" in summary and "10 step(s), exit code 0" in summary
    assert "rank 2 (localhost) is a straggler" in summary and "rank 0 (localhost)" not in summary
