"""Hangs and stragglers named by the launcher, on real gloo ranks (tests/launcher_scripts/stall_cases.py).

(a) a rank skips a collective in a data-dependent branch: the verdict names it and the
collective its peers wait in, within the stall timeout + 15 s; (b) a rank spins in its own
loop: its file:line is named; (c) a rank sleeps 3x the step time every step: a straggler,
the run still ends with 0; (d) a slow first step and a slow checkpoint save raise no stall.
(a) and (b) share one launch of 4 ranks (rank 2 spins, rank 3 skips, ranks 0,1 wait): a
launch is mostly its ranks' start-up, and the verdict must then tell two culprits apart.
(c) and (d) run on a terminal (a pty): the live table is drawn around the ranks' output.
The shared-memory lane is off (ZERORUN_SHARED_MEMORY=0): across hosts there is none, and
it would name a mismatch itself before the launcher does.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import struct
import subprocess
import termios
import time
import warnings
from pathlib import Path

import pytest
from launcher_conftest import SCRIPTS, zerorun_argv

from launcher.watch.stall import STALL_EXIT

SCRIPT = str(SCRIPTS / "stall_cases.py")
STALL_S = 3


def _launch(tmp_path: Path, world: int, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    """Off a terminal, with a progress line every second."""
    argv = zerorun_argv("--num_gpus", str(world), "--master_port", "auto", "--progress_every", "1",
                        "--stall_timeout", str(STALL_S), "--report_json", str(tmp_path / "verdict.json"),
                        "--log_dir", str(tmp_path / "logs"), "--env", "ZERORUN_SHARED_MEMORY=0",
                        "--env", "ZERORUN_HEARTBEAT_S=0.5", SCRIPT, *args)
    return subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=timeout)


def _on_a_terminal(argv: list[str], cwd: Path, timeout: float) -> tuple[int, str, bool]:
    """Run ``argv`` with a 200-column pty as its stdout and stderr: the exit status, the text (escapes removed),
    and whether it ran on the pty.

    Where no pty can be made the run goes to a pipe (no table then), said in a warning.
    """
    try:
        master, slave = pty.openpty()
    except OSError as e:
        warnings.warn(f"no pty here ({e}): the live table is not checked", stacklevel=2)
        proc = subprocess.run(argv, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout)
        return proc.returncode, proc.stdout, False
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 60, 200, 0, 0))
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "200"}
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([master], [], [], 1.0)[0]:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: no process holds the terminal any more
                break
            if not data:
                break
            chunks.append(data)
    os.close(master)
    if time.monotonic() >= deadline:
        proc.kill()  # its lifeline takes the agent and the ranks down
    rc = proc.wait(timeout=10)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07|\r", "", b"".join(chunks).decode(errors="replace"))
    return rc, text, True


def _line(marker: str) -> int:
    return next(i for i, line in enumerate(Path(SCRIPT).read_text().splitlines(), 1) if marker in line)


@pytest.mark.timeout(150)
def test_a_skipped_collective_and_a_spinning_rank_are_named_with_what_the_others_wait_in(tmp_path: Path) -> None:
    proc = _launch(tmp_path, 4, "--skip_rank", "3", "--spin_rank", "2", timeout=130)
    assert proc.returncode == STALL_EXIT, proc.stderr[-3000:]
    report = json.loads((tmp_path / "verdict.json").read_text())
    assert report["culprits"] == [2, 3], report["verdict"]
    text = report["verdict"]
    # (b) the spinning rank at its loop, first: a rank outside any collective is the likelier culprit. The
    # sample lands on either line of the two-line loop (the `while` or its body: seen both on Python 3.11)
    loop = {f"stall_cases.py:{_line('# SPIN_LINE') + k}; " for k in (0, 1)}
    assert any(text.startswith(f"stalled: rank 2 (localhost) is in script at {at}rank 3 (localhost) waits in "
                               "all_reduce #") for at in loop), text
    # (a) the rank that skipped, and the collective its peers wait in
    assert "; ranks 0,1 wait in reduce_scatter #" in text and text.count("stall_cases.py:") == 3, text
    waiting = next(g for g in report["groups"] if g["ranks"] == [0, 1])
    assert waiting["collective"]["kind"] == "reduce_scatter" and waiting["phase"] == "backward"
    assert not waiting["culprit"] and all(any("stall_cases.py" in x for x in report["stacks"][r]) for r in "0123")
    assert f"zerorun: {text}" in proc.stderr and "exit code 124" in proc.stderr  # the verdict and the summary
    stacks = list((tmp_path / "logs").glob("stall-stacks-*.txt"))
    assert stacks and "==== rank 3" in stacks[0].read_text()
    assert report["stalled_for_s"] <= STALL_S + 15, report  # from the last progress to the verdict
    assert "| 4/4 ranks alive |" in proc.stderr  # off a terminal: a progress line every --progress_every s


@pytest.mark.timeout(150)
def test_a_straggler_is_named_and_slow_set_up_and_saves_are_no_stall(tmp_path: Path) -> None:
    # step ~0.1 s; rank 2 sleeps 0.3 s more each step; the first step and the save each take 2x the stall timeout
    argv = zerorun_argv("--num_gpus", "3", "--master_port", "auto", "--stall_timeout", str(STALL_S),
                        "--report_json", str(tmp_path / "verdict.json"), "--env", "ZERORUN_SHARED_MEMORY=0",
                        "--env", "ZERORUN_HEARTBEAT_S=0.5", SCRIPT, "--steps", "10", "--slow_rank", "2",
                        "--slow_s", "0.3", "--first_step_s", str(2 * STALL_S), "--save_s", str(2 * STALL_S),
                        "--save_dir", str(tmp_path / "ckpt"))
    rc, text, tty = _on_a_terminal(argv, tmp_path, timeout=120)
    assert rc == 0, text[-3000:]
    assert "stalled" not in text and not (tmp_path / "verdict.json").exists()
    assert text.count("] rank ") == 3 and text.count(" done") == 3 and (tmp_path / "ckpt" / "latest").exists()
    assert "zerorun: rank 2 (localhost) is a straggler" in text  # in the log as it happens
    # the live table: its headline and a row per rank, rank 2's flagged
    if tty:
        assert re.search(r"\d+ s \| step \d+ \| [\d.]+ s/step \| 3/3 ranks alive \| [\d.]+ samples/s \| slowest rank 2", text)
        rows = [line.split() for line in text.splitlines() if line.startswith("localhost ")]
        assert {r[1] for r in rows} == {"0", "1", "2"} and any(r[1] == "2" and r[-1] == "straggler" for r in rows), rows
        assert not any(r[1] != "2" and r[-1] == "straggler" for r in rows)
    summary = text[text.index("run summary"):]
    assert "3 rank(s) on 1 node(s)" in summary and "10 step(s), exit code 0" in summary
    assert "rank 2 (localhost) is a straggler" in summary and "rank 0 (localhost)" not in summary
