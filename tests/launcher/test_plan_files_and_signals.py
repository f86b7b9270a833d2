"""launcher/run/planfile.py and the executor's signal path: plan files no one else can plant
or read (0600 in 0700 folders whatever the umask, O_EXCL|O_NOFOLLOW, checked by the
agent), a fresh job id and key per attempt, signal handlers that only queue, and no
node started once a signal has arrived."""

from __future__ import annotations

import io
import os
import queue
import signal
import stat
import sys
import threading
from pathlib import Path

import pytest

from launcher.elastic.restarts import RestartPolicy, run_with_restarts
from launcher.errors import LaunchError
from launcher.plan.filters import NodeSlots
from launcher.plan.hostfile import Host
from launcher.plan.launch_plan import build_plan
from launcher.plan.runners import NodeCommand, PayloadMode
from launcher.run.agent import Agent
from launcher.run.executor import Executor
from launcher.run.planfile import read_plan_file, write_plan_file


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def _plan(tmp_path: Path, key: str = "k" * 32):  # type: ignore[no-untyped-def]
    return build_plan((NodeSlots(Host("localhost", 1), (0,)),), command=("x",), job_id="j", cwd=str(tmp_path),
                      python=sys.executable, local=True, channel_key=key)


def test_plan_files_are_private_whatever_the_umask(tmp_path: Path) -> None:
    old = os.umask(0o002)
    try:
        (tmp_path / ".zerorun").mkdir(mode=0o775)  # left by an older run, group-writable
        path = tmp_path / ".zerorun" / "job1" / "node0.json"
        write_plan_file(str(path), '{"plan": 1}')
        write_plan_file(str(path.with_name("node1.json")), "{}")
    finally:
        os.umask(old)
    assert (_mode(tmp_path / ".zerorun"), _mode(path.parent), _mode(path)) == (0o700, 0o700, 0o600)
    assert read_plan_file(str(path)) == '{"plan": 1}' and not path.exists()


def test_a_planted_file_or_symlink_is_refused_by_the_launcher(tmp_path: Path) -> None:
    job = tmp_path / ".zerorun" / "job1"
    job.mkdir(parents=True, mode=0o700)
    target = tmp_path / "secrets-go-here"
    (job / "node0.json").symlink_to(target)
    (job / "node1.json").write_text('{"command": ["sh", "-c", "evil"]}')
    for name in ("node0.json", "node1.json"):
        with pytest.raises(LaunchError, match="exists already"):
            write_plan_file(str(job / name), "{}")
    assert not target.exists() and "evil" in (job / "node1.json").read_text()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / ".zerorun").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(LaunchError, match="symlink"):
        write_plan_file(str(tmp_path / "w" / ".zerorun" / "j" / "node0.json"), "{}")


def test_the_agent_refuses_a_planted_plan_file(tmp_path: Path) -> None:
    job = tmp_path / "job"
    job.mkdir(mode=0o700)
    (job / "real.json").write_text("{}")
    os.chmod(job / "real.json", 0o600)
    (job / "link.json").symlink_to(job / "real.json")
    with pytest.raises(SystemExit, match="refusing the plan file .*link.json: it cannot be opened as a plain file"):
        read_plan_file(str(job / "link.json"))
    os.chmod(job / "real.json", 0o644)
    with pytest.raises(SystemExit, match="its file has mode 644, open to other users"):
        read_plan_file(str(job / "real.json"))
    os.chmod(job / "real.json", 0o600)
    os.chmod(job, 0o770)
    with pytest.raises(SystemExit, match="its folder has mode 770"):
        read_plan_file(str(job / "real.json"))
    os.chmod(job, 0o700)
    if os.geteuid() == 0:  # a file another user planted (chown needs root)
        os.chown(job / "real.json", 65534, 65534)
        with pytest.raises(SystemExit, match="its file belongs to uid 65534"):
            read_plan_file(str(job / "real.json"))
        os.chown(job / "real.json", 0, 0)
    assert (job / "real.json").exists()  # a refused file is left for the user to look at
    assert read_plan_file(str(job / "real.json")) == "{}"


def test_every_attempt_has_its_own_job_id_and_key(tmp_path: Path) -> None:
    seen = []

    def commands_for(plan):  # type: ignore[no-untyped-def]
        seen.append((plan.job_id, plan.channel_key))
        return [NodeCommand((sys.executable, "-c", "raise SystemExit(3)"), 0, "localhost", PayloadMode.NONE)]

    result = run_with_restarts(lambda n: _plan(tmp_path), commands_for, RestartPolicy(2, 0.0), err=io.StringIO())
    assert result.exit_code == 3 and len(seen) == 3
    assert len({j for j, _ in seen}) == 3 and len({k for _, k in seen}) == 3


def test_the_signal_handler_takes_no_lock(tmp_path: Path) -> None:
    executor = Executor(_plan(tmp_path), [])

    def interrupted_while_printing() -> None:  # the signal lands while this thread holds the output lock
        with executor._lock:
            executor._on_signal(signal.SIGINT, None)

    t = threading.Thread(target=interrupted_while_printing, daemon=True)
    t.start()
    t.join(timeout=2)
    assert not t.is_alive() and executor.signals.get_nowait() == signal.SIGINT
    assert isinstance(Agent(_plan(tmp_path), 0, None).commands, queue.SimpleQueue)  # type: ignore[arg-type]


def test_no_node_starts_after_a_signal(tmp_path: Path) -> None:
    cmd = NodeCommand(("sleep", "30"), 0, "localhost", PayloadMode.NONE)
    executor = Executor(_plan(tmp_path), [cmd, cmd, cmd], err=io.StringIO())
    start = executor._start

    def start_then_signal(c, payload):  # type: ignore[no-untyped-def]
        run = start(c, payload)
        executor._on_signal(signal.SIGTERM, None)  # Ctrl-C or SIGTERM arrives while the first node starts
        return run

    executor._start = start_then_signal  # type: ignore[method-assign]
    result = executor.run()
    assert len(executor.runs) == 1 and result.exit_code == 143 and result.interrupted
    assert executor.runs[0].proc.returncode is not None
