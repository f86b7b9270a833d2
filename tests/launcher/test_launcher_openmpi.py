"""``zerorun --launcher openmpi`` for real: ``mpirun`` starts its daemons over the test's
loopback sshd (127.0.0.2 and 127.0.0.3, 2 slots each; see launcher_conftest.py) or runs
on this machine alone, and the shim under each rank maps OMPI_COMM_WORLD_* to RANK etc.
Checked: 4-rank (and local 2-rank) gloo jobs; a failing rank ends the job with its exit
code; Ctrl-C and a killed launcher leave no rank behind (checked by pid).

The tests run as root in CI, and mpirun refuses root unless both
OMPI_ALLOW_RUN_AS_ROOT=1 and OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 are exported (or
``--launcher_args --allow-run-as-root`` is given): the tests export them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from launcher_conftest import SCRIPTS, SshServer, sshd, wait_for_rank_pids, wait_gone, zerorun_argv  # noqa: F401
from launcher_slurm import skip_loudly

NODES = ("127.0.0.2", "127.0.0.3")


@pytest.fixture(scope="module")
def mpi_env() -> Iterator[dict[str, str]]:
    if not shutil.which("mpirun"):
        skip_loudly("OpenMPI", "mpirun not installed (scripts/setup-tests.sh installs openmpi-bin)")
    yield {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}


def _argv(server: SshServer | None, tmp_path: Path, *args: str) -> list[str]:
    where: tuple[str, ...] = ("--num_gpus", "2")
    if server is not None:
        where = ("--hostfile", str(server.hostfile(tmp_path / "hostfile")), "--ssh_port", str(server.port),
                 "--ssh_args", server.ssh_args)
    return zerorun_argv("--launcher", "openmpi", *where, "--master_port", "auto", "--kill_timeout", "3", *args)


def test_four_rank_gloo_job_over_two_ssh_nodes(sshd: SshServer, mpi_env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    argv = _argv(sshd, tmp_path, str(SCRIPTS / "allreduce.py"), "a b", "$HOME")
    out = subprocess.run(argv, cwd=tmp_path, env=mpi_env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    for rank, (node, local) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        line = f"[{NODES[node]}:{rank}] rank {rank}/4 local {local} node {node} sum 10 args ['--local_rank={local}', 'a b', '$HOME']"
        assert line in out.stdout, out.stdout


def test_doctor_probes_each_node_through_mpirun(sshd: SshServer, mpi_env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    import json
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.2", 0))
        port = str(s.getsockname()[1])
    argv = zerorun_argv("doctor", "--launcher", "openmpi", "--hostfile", str(sshd.hostfile(tmp_path / "hostfile")),
                        "--ssh_port", str(sshd.port), "--ssh_args", sshd.ssh_args, "--master_port", port,
                        "--no-collective", "--json")
    out = subprocess.run(argv, cwd=tmp_path, env=mpi_env, capture_output=True, text=True, timeout=60)
    data = json.loads(out.stdout)
    assert out.returncode == 0 and data["ok"], out.stdout + out.stderr
    assert data["runner"] == "openmpi" and [h["host"] for h in data["hosts"]] == list(NODES)
    assert all(h["facts"]["network"]["connect"]["result"] == "ok" for h in data["hosts"])  # the listener, via mpirun


def test_two_rank_job_on_this_machine(mpi_env: dict[str, str], tmp_path: Path) -> None:
    out = subprocess.run(_argv(None, tmp_path, str(SCRIPTS / "allreduce.py")), cwd=tmp_path, env=mpi_env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "[localhost:1] rank 1/2 local 1 node 0 sum 3" in out.stdout


def test_failing_rank_on_the_second_node_ends_the_job_with_its_code(
        sshd: SshServer, mpi_env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    pids = tmp_path / "pids"
    pids.mkdir()
    argv = _argv(sshd, tmp_path, str(SCRIPTS / "hang_or_fail.py"), "--pid_dir", str(pids),
                 "--fail_rank", "3", "--exit_code", "7")
    out = subprocess.run(argv, cwd=tmp_path, env=mpi_env, capture_output=True, text=True, timeout=120)
    teardown = time.time() - float((pids / "failed_at").read_text())
    assert out.returncode == 7, out.stderr
    assert "[127.0.0.3:3] rank 3 fails now" in out.stderr
    assert "host      : 127.0.0.3 (node 1)" in out.stderr and "rank      : 3 of 4 (local rank 1)" in out.stderr
    assert wait_gone([int((pids / f"rank{r}.pid").read_text()) for r in range(4)], timeout=1) == []
    print(f"openmpi teardown: {teardown:.2f} s from the rank's failure to the launcher's exit")
    assert teardown < 10, f"teardown took {teardown:.1f} s"


def _start_hanging(server: SshServer, env: dict[str, str], tmp_path: Path) -> tuple[subprocess.Popen[str], list[int]]:
    pids = tmp_path / "pids"
    pids.mkdir()
    argv = _argv(server, tmp_path, str(SCRIPTS / "hang_or_fail.py"), "--pid_dir", str(pids), "--no_torch")
    proc = subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, wait_for_rank_pids(pids, 4, timeout=60, proc=proc)


def test_ctrl_c_stops_every_rank(sshd: SshServer, mpi_env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    proc, pids = _start_hanging(sshd, mpi_env, tmp_path)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert wait_gone(pids, timeout=5) == []


def test_killed_launcher_takes_mpirun_and_its_ranks_down(
        sshd: SshServer, mpi_env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    proc, pids = _start_hanging(sshd, mpi_env, tmp_path)
    proc.send_signal(signal.SIGKILL)  # mpirun gets SIGTERM through its lifeline
    proc.communicate(timeout=10)
    assert wait_gone(pids, timeout=10) == []
