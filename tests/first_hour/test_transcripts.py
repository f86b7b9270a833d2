"""What a newcomer reads, captured whole at world 2: a config error inside the script and a
rank crash. The error text appears once, zerorun's own errors carry no traceback, and each
transcript is under 25 lines. (The README's main job is captured in test_install.py.)

Before: the six-line config error three times with a 7-frame traceback each (~50 lines), and
a 17-frame PeerLost traceback from the surviving rank."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from launcher.watch.once import OnceFilter
from launcher.watch.report import Failure, format_report
from zerorun.engine.comm.shm import PeerLost
from zerorun.errors import ZerorunError
from zerorun.rank_errors import _Hook

SCRIPTS = Path(__file__).parent / "scripts"


def _launch(script: str, tmp_path: Path) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("ZERORUN_DEBUG", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-m", "zerorun.cli", "--num_gpus", "2", "--master_port", "auto",
                          "--kill_timeout", "5", str(SCRIPTS / script)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    return out.returncode, out.stdout + out.stderr


@pytest.mark.timeout(150)
def test_a_config_error_every_rank_raises_is_shown_once(tmp_path: Path) -> None:
    rc, text = _launch("bad_config.py", tmp_path)
    assert rc == 1, text
    assert text.count("zero_optimization.stage: 4 is not one of 0, 1, 2, 3") == 1, text
    assert text.count("hint: fix the keys listed above") == 1, text
    assert "Traceback" not in text and "error     : printed above (by rank(s)" in text, text
    # 24-25 lines: the threads note, the traceback (4), rank 0's error and hint (2, when it prints before it is
    # stopped), the stop line, the summary table (7) and the root-cause box (10)
    assert len(text.splitlines()) <= 26, text
    assert "training completed" not in text, text  # rank 1's own error ended it, not its teardown


@pytest.mark.timeout(150)
def test_a_rank_crash_shows_its_traceback_once_and_the_lost_peer_in_one_line(tmp_path: Path) -> None:
    rc, text = _launch("crash.py", tmp_path)
    assert rc == 1, text
    assert text.count("RuntimeError: boom: rank 1's own bug") == 2, text  # its traceback, and the box quotes it
    assert "  error     : RuntimeError: boom: rank 1's own bug\n  raised at : " in text, text
    assert text.count("Traceback") == 1, text  # the user's own error keeps its frames; PeerLost has none
    assert "rank  : 1 of 2" in text.replace("rank      :", "rank  :"), text
    # 24-25 lines: the threads note, the traceback (4), rank 0's error and hint (2, when it prints before it is
    # stopped), the stop line, the summary table (7) and the root-cause box (10)
    assert len(text.splitlines()) <= 26, text
    assert "training completed" not in text, text  # rank 1's own error ended it, not its teardown


def test_the_rank_hook_prints_message_and_hint_and_debug_keeps_the_traceback(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[BaseException] = []
    hook = _Hook(lambda kind, value, tb: seen.append(value))
    monkeypatch.delenv("ZERORUN_DEBUG", raising=False)
    hook(PeerLost, PeerLost("[rank 0] rank 1 exited"), None)
    assert capsys.readouterr().err.splitlines() == [
        "error: [rank 0] rank 1 exited", "hint: the rank that stopped first is the root cause: its own error is above"]
    hook(ValueError, ValueError("the user's"), None)
    monkeypatch.setenv("ZERORUN_DEBUG", "1")
    hook(ZerorunError, ZerorunError("x"), None)
    assert [type(e) for e in seen] == [ValueError, ZerorunError] and capsys.readouterr().err == ""


def test_the_console_filter_and_the_report() -> None:
    once = OnceFilter()
    lines = ["[h:0] [rank0]: error: bad stage", "[h:1] [rank1]: error: bad stage", "[h:1] [rank1]:   detail",
             "[h:0] [rank0]:   detail", "[h:0] [rank0]: hint: fix it", "[h:1] [rank1]: hint: fix it",
             "[h:0] step 1", "[h:1] step 1", "[h:1] Traceback (most recent call last):",
             "[h:0] Traceback (most recent call last):"]
    shown = [line for line in lines if once.show(line)]
    assert shown == ["[h:0] [rank0]: error: bad stage", "[h:1] [rank1]:   detail", "[h:0] [rank0]: hint: fix it",
                     "[h:0] step 1", "[h:1] step 1", "[h:1] Traceback (most recent call last):",
                     "[h:0] Traceback (most recent call last):"]
    tail = ("[rank1]: error: bad stage", "[rank1]:   detail", "[rank1]: hint: fix it")
    failures = [Failure("h", 0, 1, 0.0, rank=1, local_rank=1, stderr_tail=tail),
                Failure("h", 0, 1, 0.0, rank=0, local_rank=0, stderr_tail=tail[:1] + tail[1:])]
    box = format_report(failures, 2, console=once)
    assert "bad stage" not in box and "printed above (by rank(s) 0, 1)" in box
    assert "Also failed with the same error (exit code 1): rank(s) 0" in box
    assert "bad stage" in format_report(failures, 2)  # without a console (a log-only run) the tail is kept
