"""A finished run exits 0, every time: no rank aborts or hangs at interpreter exit after training finished.

A C++ thread that needs the GIL once the interpreter finalizes aborts the rank ("terminate called
without an active exception", exit -6); gloo's worker threads are such threads. The stress test runs
as the benchmark runs: plain DDP, then zerorun at stages 1, 2 and 3 and the README's main job, round
after round (35 world-2 runs, :mod:`exit_rounds`: each rank a process forked from a clean one-thread
server that imported torch once, ending through the interpreter's own finalization), in each of a
script's endings, on zerorun's group or the script's; then the README's job under the launcher.
Every rank exits 0, none prints "terminate called", and a rank on the group zerorun created
finalizes with its main thread alone. The checker is tested on its own with torch-free stand-ins
(an abort after the last step, a hang, a C++ abort line, an error), so the stress test can fail.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from exit_check import failures
from exit_rounds import Run, plan

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 7  # x (ddp, z1, z2, z3, readme) = 35 runs of 2 ranks


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore", "ZERORUN_HEARTBEAT_S": "0.2",
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}


def _rounds(*args: str, timeout: float) -> tuple[list[dict], int | None, str]:
    """Run :mod:`exit_rounds` in its own session (its ranks with it); past ``timeout`` the session is
    killed and the records so far come back with return code None."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "tests/engine/exit_rounds.py"), *args], env=_env(), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the server and every rank it forked
        out, err = proc.communicate()
        err += f"\nexit_rounds.py still running after {timeout:.0f} s: killed"
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return records, proc.returncode if proc.returncode >= 0 else None, err


@pytest.mark.timeout(600)  # ~40 s of CPU; minutes on a machine shared with many other jobs
def test_rounds_of_ddp_every_stage_and_the_readme_job_exit_0() -> None:
    records, code, err = _rounds("--rounds", str(ROUNDS), "--run-timeout", "60", timeout=570)
    runs = plan(ROUNDS)
    assert len(runs) >= 30 and {r.system for r in runs} == {"ddp", "z1", "z2", "z3", "readme"}
    bad = failures(records, runs)
    assert not bad, f"{len(bad)} bad rank exits of {2 * len(runs)}:\n" + "\n".join(bad[:6]) + err[-2000:]
    assert code == 0, err[-3000:]


def test_the_checker_reports_an_abort_after_the_last_step_a_hang_and_a_cpp_abort() -> None:
    endings = ["nothing", "abort", "terminate", "fail", "hang", "nothing"]
    records, code, err = _rounds("--probe", "--run-timeout", "2", "--runs", ",".join(f"probe:{e}" for e in endings),
                                 timeout=120)
    bad = failures(records, [Run(i, "probe", e) for i, e in enumerate(endings)])
    assert code == 1, err
    assert [line.split(":")[0] for line in bad] == [
        "run 1 (probe, ending abort, zerorun's group) rank 1", "run 2 (probe, ending terminate, zerorun's group) rank 1",
        "run 3 (probe, ending fail, zerorun's group) rank 0", "run 4 (probe, ending hang, zerorun's group) rank 0",
        "run 5 (probe) rank 0", "run 5 (probe) rank 1"], bad
    assert "exit -6 after its last step" in bad[0] and "'terminate called'" in bad[1] and "exit 1" in bad[2]
    assert "hung after its last step" in bad[3] and "no record" in bad[4]
    hung = next(r for r in records if r.get("hung"))
    assert "hrtimer_nanosleep" in str(hung["hang"]["threads"]) and "_probe" in "\n".join(hung["tail"])
    with pytest.raises(ProcessLookupError):  # the hung rank was killed (and reaped)
        os.kill(hung["pid"], 0)


_QUIESCE_PROBE = """
import _thread, sys, threading, time
import torch
import torch.distributed as dist
from zerorun.engine import teardown

dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
dist.all_reduce(torch.ones(2))
deadline = time.monotonic() + 5
while not teardown.backend_threads() and time.monotonic() < deadline:  # the workers name themselves
    time.sleep(0.01)
assert teardown.backend_threads() and teardown.quiesce(limit_s=5.0), teardown.backend_threads()
release = threading.Event()
_thread.start_new_thread(release.wait, ())  # a thread state threading does not know, as a C++ thread's
while teardown.foreign_thread_states() == 0 and time.monotonic() < deadline:
    time.sleep(0.001)
assert teardown.foreign_thread_states() == 1
assert not teardown.quiesce(limit_s=0.2)
threading.Timer(0.3, release.set).start()
start = time.monotonic()
assert teardown.quiesce(limit_s=5.0) and time.monotonic() - start >= 0.25
dist.destroy_process_group()
print("quiesce probe ok")
"""


@pytest.mark.timeout(120)
def test_quiesce_waits_for_a_thread_inside_a_gil_acquisition(tmp_path: Path) -> None:
    """The exit path's wait before it frees a group: a thread state of no Python thread (a gloo worker
    waiting for the GIL to free its last work) keeps it waiting, since freeing the group joins that worker.
    In a process of its own: a test runner's process has foreign thread states and other groups' workers."""
    proc = subprocess.run([sys.executable, "-c", _QUIESCE_PROBE, str(tmp_path / "rdzv")], capture_output=True,
                          text=True, timeout=100, env=_env(), cwd=ROOT)
    assert proc.returncode == 0 and "quiesce probe ok" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-3000:]


def test_the_exit_path_waits_for_the_workers_before_it_frees_a_group(monkeypatch: pytest.MonkeyPatch) -> None:
    from zerorun.engine import teardown
    from zerorun.engine.comm import bootstrap

    calls: list[str] = []
    monkeypatch.setattr(teardown, "_REGISTERED_PID", os.getpid())
    monkeypatch.setattr(teardown, "quiesce", lambda: calls.append("quiesce") or True)
    monkeypatch.setattr(bootstrap, "owns_group", lambda: True)
    monkeypatch.setattr(bootstrap, "destroy_group", lambda: calls.append("free"))
    monkeypatch.setattr(teardown.gc, "collect", lambda: calls.append("free") or 0)
    teardown.at_exit()
    assert calls[0] == "quiesce" and calls.index("quiesce") < calls.index("free"), calls


@pytest.mark.timeout(300)
def test_the_readme_job_under_the_launcher_exits_0() -> None:
    cmd = [sys.executable, "-m", "zerorun.cli", "--num_gpus", "2", "--master_port", "auto",
           str(ROOT / "examples/train_toy.py"), "--config", str(ROOT / "templates/zero2.yaml"), "--steps", "3"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=280, env=_env(), cwd=ROOT)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "terminate called" not in out, out[-3000:]


def test_gloo_workers_are_found_by_name_or_as_the_unnamed_native_threads() -> None:
    """torch 2.13 names gloo's workers pt_gloo; torch 2.6.0 does not: they carry the process's name and
    would be missed, so quiesce would wait for nothing (the exit hang came back on 2.6.0)."""
    from zerorun.engine.teardown import pick_backend_threads

    named = {"10": "python", "11": "pt_gloo_0", "12": "pt_tcpstore_uv", "13": "python", "14": "pt_gloo_1"}
    assert pick_backend_threads(named, {"10"}, "10") == ["11", "14"]
    unnamed = {"10": "python", "11": "python", "12": "pt_tcpstore_uv", "13": "python", "15": "heartbeat"}
    # 13 is a Python thread (threading), 12 and 15 are named otherwise: 11 is the worker
    assert pick_backend_threads(unnamed, {"10", "13"}, "10") == ["11"]
    assert pick_backend_threads({"10": "python"}, {"10"}, "10") == []
