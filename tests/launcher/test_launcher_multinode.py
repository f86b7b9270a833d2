"""Real multi-node launches: an sshd started by the test listens on 127.0.0.2 and
127.0.0.3, the two "nodes" of a hostfile (2 slots each); zerorun reaches them with
``--launcher ssh`` and ``--launcher pdsh`` and runs 4-rank gloo jobs. The failure
tests leave the surviving ranks sleeping after a barrier (as under NCCL, nothing
but the launcher can end them) and check by pid that every rank is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from launcher_conftest import (  # noqa: F401
    SCRIPTS,
    SshServer,
    launch_tree,
    sshd,
    wait_for_rank_pids,
    wait_gone,
    wait_groups_gone,
    zerorun_argv,
)

TRICKY = ["a b", "it's", "$HOME", "100%h", 'q"q']
HOSTILE_CWD = "bob's \"run\" $(id >pwned) ;touch pwned2 && 100%h"
"""A working directory every string sent to a remote shell must survive, quoted."""


def _launch_args(server: SshServer, tmp_path: Path, launcher: str, *extra: str) -> list[str]:
    hostfile = server.hostfile(tmp_path / "hostfile")
    return zerorun_argv("--hostfile", str(hostfile), "--launcher", launcher, "--ssh_port", str(server.port),
                        "--ssh_args", server.ssh_args, "--master_port", "auto", *extra)


@pytest.mark.parametrize("launcher", ["ssh", "pdsh"])
def test_four_rank_gloo_job_over_two_nodes(sshd: SshServer, tmp_path: Path, launcher: str) -> None:  # noqa: F811
    check = [] if launcher == "ssh" else ["--no_ssh_check"]  # the ssh run also exercises the preflight
    argv = _launch_args(sshd, tmp_path, launcher, *check, str(SCRIPTS / "allreduce.py"), *TRICKY)
    cwd = tmp_path / HOSTILE_CWD
    cwd.mkdir()
    out = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    for rank, (node, local) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        host = ("127.0.0.2", "127.0.0.3")[node]
        assert f"[{host}:{rank}] rank {rank}/4 local {local} node {node} sum 10 args {[f'--local_rank={local}', *TRICKY]!r} cvd None" in out.stdout
    assert not (cwd / ".zerorun").exists()  # pdsh's 0600 plan files are deleted
    for where in (tmp_path, cwd, Path.home()):  # nothing in the folder's name ran
        assert not (where / "pwned").exists() and not (where / "pwned2").exists()


def _failing_run(server: SshServer, tmp_path: Path, launcher: str, *fail: str) -> tuple[subprocess.CompletedProcess[str], list[int], float]:
    pids = tmp_path / "pids"
    pids.mkdir()
    argv = _launch_args(server, tmp_path, launcher, "--no_ssh_check", "--kill_timeout", "3",
                        str(SCRIPTS / "hang_or_fail.py"), "--pid_dir", str(pids), *fail)
    out = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    ended = time.time()
    pid_list = [int((pids / f"rank{r}.pid").read_text()) for r in range(4)]
    failed_at = float((pids / "failed_at").read_text())
    assert ended - failed_at < 10, f"teardown took {ended - failed_at:.1f} s"
    return out, pid_list, failed_at


def test_rank_exit_code_on_second_node_stops_both_nodes(sshd: SshServer, tmp_path: Path) -> None:  # noqa: F811
    out, pids, _ = _failing_run(sshd, tmp_path, "ssh", "--fail_rank", "3", "--exit_code", "7")
    assert out.returncode == 7, out.stderr
    assert wait_gone(pids, timeout=0.5) == []
    assert "[127.0.0.3:3] rank 3 fails now" in out.stderr  # the failing rank's own output, prefixed
    assert "Root cause (first observed failure):" in out.stderr
    assert "host      : 127.0.0.3 (node 1)" in out.stderr and "status    : exit code 7" in out.stderr


def test_rank_killed_by_signal_gives_137(sshd: SshServer, tmp_path: Path) -> None:  # noqa: F811
    out, pids, _ = _failing_run(sshd, tmp_path, "pdsh", "--fail_rank", "1", "--signal", "SIGKILL")
    assert out.returncode == 137, out.stderr
    assert wait_gone(pids, timeout=0.5) == []
    assert "[127.0.0.2:1] rank 1 fails now" in out.stderr
    assert "exit code 137 = 128+9 (SIGKILL)" in out.stderr


def _start_hanging(server: SshServer, tmp_path: Path, launcher: str = "ssh") -> tuple[subprocess.Popen[str], list[int]]:
    pids = tmp_path / "pids"
    pids.mkdir()
    argv = _launch_args(server, tmp_path, launcher, "--no_ssh_check", "--kill_timeout", "3",
                        str(SCRIPTS / "hang_or_fail.py"), "--pid_dir", str(pids), "--no_torch")
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, wait_for_rank_pids(pids, 4, timeout=90, proc=proc)


@pytest.mark.parametrize("launcher", ["ssh", "pdsh"])
def test_launcher_killed_remote_agents_stop_their_ranks(sshd: SshServer, tmp_path: Path, launcher: str) -> None:  # noqa: F811
    proc, pids = _start_hanging(sshd, tmp_path, launcher)
    groups = launch_tree(proc.pid) - {os.getpgrp()}  # ssh or pdsh (and pdsh's ssh), in groups of their own
    os.kill(proc.pid, signal.SIGKILL)  # the launcher dies without a word (the OOM killer)
    proc.communicate(timeout=10)
    # ssh and pdsh get SIGTERM from their lifeline; ssh's channel closes, the remote agents
    # see EOF and stop their ranks
    assert wait_gone(pids, timeout=10) == []
    assert wait_groups_gone(groups, timeout=10) == []


def test_ctrl_c_stops_every_node(sshd: SshServer, tmp_path: Path) -> None:  # noqa: F811
    proc, pids = _start_hanging(sshd, tmp_path)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert wait_gone(pids, timeout=1) == []


def test_preflight_shows_ssh_error_text(sshd: SshServer, tmp_path: Path) -> None:  # noqa: F811
    other_key = tmp_path / "wrong_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_key)], check=True)
    hostfile = sshd.hostfile(tmp_path / "hostfile")
    argv = zerorun_argv("--hostfile", str(hostfile), "--launcher", "ssh", "--ssh_port", str(sshd.port),
                        "--ssh_args", sshd.ssh_args.replace(str(sshd.key), str(other_key)), "t.py")
    out = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert "127.0.0.2 is not reachable over ssh" in out.stderr and "127.0.0.3 is not reachable over ssh" in out.stderr
    assert "Permission denied" in out.stderr
