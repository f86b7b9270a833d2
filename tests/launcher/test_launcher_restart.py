"""``--max_restarts``: a gang that loses a rank restarts and ends where an uninterrupted run ends.

The proof run: 2 gloo ranks train a tiny ZeRO-2 model for 14 steps (over an epoch
boundary), checkpointing every 3 steps; rank 1 SIGKILLs itself after step 7. With
``--max_restarts 1`` the launcher tears the gang down, starts it again, the script
loads ``latest`` (step 6) and the loader continues at the 13th micro batch of epoch 0.
The final parameters must equal those of the same run without the kill - which they
would not if the data position were lost (the resumed run would re-read epoch 0 from
its start).
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import torch
from launcher_conftest import SCRIPTS, zerorun_argv

from launcher.elastic.restarts import RestartPolicy, restart_note
from launcher.errors import LaunchError
from launcher.watch.report import Failure


def _train(tmp: Path, launcher: tuple[str, ...] = (), script: tuple[str, ...] = ()) -> subprocess.Popen[str]:
    tmp.mkdir()
    argv = zerorun_argv("--num_gpus", "2", "--master_port", "auto", *launcher, str(SCRIPTS / "train_resume.py"),
                        "--ckpt", str(tmp / "ckpt"), "--out", str(tmp / "params.pt"), *script)
    return subprocess.Popen(argv, cwd=tmp, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc: subprocess.Popen[str]) -> subprocess.CompletedProcess[str]:
    try:
        out, err = proc.communicate(timeout=150)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_sigkilled_rank_restarts_and_ends_equal_to_an_uninterrupted_run(tmp_path: Path) -> None:
    # both runs at once: the wall time of one run, not two
    straight = _train(tmp_path / "straight")
    killed = _train(tmp_path / "killed", ("--max_restarts", "1", "--restart_backoff", "0.5"), ("--kill_rank", "1"))
    ref, run = _finish(straight), _finish(killed)
    assert ref.returncode == 0, ref.stdout + ref.stderr
    assert run.returncode == 0, run.stdout + run.stderr
    note = re.search(r"zerorun: rank 1 on localhost failed at (\S+) \(exit code 137 = 128\+9 \(SIGKILL\).*\); "
                     r"every rank stopped ([\d.]+) s later; restart 1/1 of every rank in 0.5 s", run.stderr)
    assert note, run.stderr
    assert float(note.group(2)) < 10, f"teardown took {note.group(2)} s"
    assert "[localhost:0] [zerorun] resumed at global step 6, epoch 0 after 24 samples" in run.stdout
    resumed = run.stdout.split("resumed at global step 6", 1)[1]
    step7 = re.search(r"\[localhost:0\] step 7 t=([\d.]+)", resumed)
    assert step7, "the restarted gang did not continue at step 7"
    failed_at = float((tmp_path / "killed" / "failed_at").read_text())
    print(f"restart: every rank stopped {note.group(2)} s after the failure; the resumed step 7 ended "
          f"{float(step7.group(1)) - failed_at:.2f} s after it (0.5 s backoff)")
    expected, got = torch.load(tmp_path / "straight" / "params.pt"), torch.load(tmp_path / "killed" / "params.pt")
    assert expected.keys() == got.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-5, atol=1e-6, msg=f"{name} after the restart")


def test_restarts_run_out_and_the_failure_code_stays(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    argv = zerorun_argv("--num_gpus", "2", "--max_restarts", "1", "--restart_backoff", "0",
                        str(SCRIPTS / "hang_or_fail.py"), "--pid_dir", str(pids), "--no_torch", "--fail_rank", "0")
    out = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 7, out.stderr
    assert out.stderr.count("[localhost:0] rank 0 fails now") == 2  # the first attempt and the one restart
    assert "restart 1/1 of every rank in 0.0 s" in out.stderr
    assert "zerorun: giving up after 1 restart(s) (--max_restarts 1)" in out.stderr


def test_backoff_doubles_up_to_a_minute_and_bad_values_fail_early() -> None:
    policy = RestartPolicy(max_restarts=9, backoff_s=2.0)
    assert [policy.delay(n) for n in (1, 2, 3, 6, 9)] == [2.0, 4.0, 8.0, 60.0, 60.0]
    with pytest.raises(LaunchError, match="negative"):
        RestartPolicy(max_restarts=-1)
    note = restart_note(Failure("w2", 1, 7, 100.0, rank=3), 1, policy, 101.25)
    assert "rank 3 on w2 failed at " in note and "(exit code 7); every rank stopped 1.2 s later" in note
    assert note.endswith("restart 1/9 of every rank in 2.0 s")
