"""Fixtures for the launcher's multi-process tests (imported by tests/launcher/test_launcher_*.py).

``sshd``: a real OpenSSH server started by the test, as root, on a free high port of
the loopback addresses 127.0.0.2 and 127.0.0.3 (and 127.0.0.4, a third node for the elastic
tests), with host and user keys generated
in a temporary directory and its own sshd_config. Two "nodes" are those two
addresses; nothing leaves the machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
NODES = ("127.0.0.2", "127.0.0.3")
THIRD = "127.0.0.4"
"""A third loopback "node" the server also listens on (the elastic tests' 3-node pool)."""
LISTEN = (*NODES, THIRD)
SCRIPTS = Path(__file__).parent / "launcher_scripts"


@dataclass(frozen=True)
class SshServer:
    port: int
    key: Path
    root: Path

    @property
    def ssh_args(self) -> str:
        return (f"-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR "
                f"-i {self.key}")

    def hostfile(self, path: Path, slots: int = 2) -> Path:
        path.write_text("".join(f"{addr} slots={slots}  # loopback node\n" for addr in NODES))
        return path


def _free_port(addr: str) -> int:
    with socket.socket() as s:
        s.bind((addr, 0))
        return s.getsockname()[1]


def _wait_listening(port: int, deadline: float) -> None:
    for addr in LISTEN:
        while True:
            try:
                socket.create_connection((addr, port), timeout=0.5).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshServer]:
    if os.geteuid() != 0 or not os.path.exists(SSHD):
        pytest.skip("needs root and openssh-server (scripts/setup-tests.sh installs it)")
    root = tmp_path_factory.mktemp("sshd")
    for name in ("host_key", "user_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / name)], check=True)
    (root / "authorized_keys").write_text((root / "user_key.pub").read_text())
    port = _free_port(NODES[0])
    config = root / "sshd_config"
    config.write_text("\n".join([
        f"Port {port}", *(f"ListenAddress {a}" for a in LISTEN), f"HostKey {root / 'host_key'}",
        f"AuthorizedKeysFile {root / 'authorized_keys'}", "PermitRootLogin prohibit-password",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
        f"PidFile {root / 'sshd.pid'}", "MaxStartups 100", "MaxSessions 100", "",
    ]))
    Path("/run/sshd").mkdir(parents=True, exist_ok=True)  # sshd's privilege-separation directory
    proc = subprocess.Popen([SSHD, "-D", "-f", str(config), "-E", str(root / "sshd.log")])
    try:
        _wait_listening(port, time.monotonic() + 10)
        yield SshServer(port, root / "user_key", root)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=10)


def zerorun_argv(*args: str) -> list[str]:
    """The CLI as a subprocess (no reliance on PATH)."""
    return [sys.executable, "-m", "zerorun.cli", *args]


def wait_for_files(paths: list[Path], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all(p.exists() and p.read_text().strip() for p in paths):
        if time.monotonic() > deadline:
            missing = [str(p) for p in paths if not p.exists()]
            raise AssertionError(f"ranks did not start within {timeout} s; missing {missing}")
        time.sleep(0.05)


def wait_for_rank_pids(pid_dir: Path, ranks: int, timeout: float,
                       proc: subprocess.Popen[str] | None = None) -> list[int]:
    """The pids the ranks of ``hang_or_fail.py --pid_dir`` wrote; ``proc`` (the launch) is killed if
    they did not all start within ``timeout``."""
    files = [pid_dir / f"rank{r}.pid" for r in range(ranks)]
    try:
        wait_for_files(files, timeout=timeout)
    except AssertionError:
        if proc is not None:
            proc.kill()
        raise
    return [int(f.read_text()) for f in files]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before, or while, /proc was read
        return False


def wait_gone(pids: list[int], timeout: float) -> list[int]:
    """The pids still alive after ``timeout`` seconds (empty when all went)."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in pids if alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


def groups_alive(pgids: set[int]) -> list[int]:
    """Pids of live processes in any of the process groups ``pgids`` (zombies count as gone)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] != "Z" and int(fields[2]) in pgids:
            found.append(int(entry))
    return found


def launch_tree(launcher_pid: int) -> set[int]:
    """The process groups of the launcher and of every descendant it has now."""
    children: dict[int, list[int]] = {}
    groups: dict[int, int] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(entry))
        groups[int(entry)] = int(fields[2])
    todo, seen = [launcher_pid], set()
    while todo:
        pid = todo.pop()
        seen.add(pid)
        todo += children.get(pid, [])
    return {groups[p] for p in seen if p in groups}


def wait_groups_gone(pgids: set[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    while (left := groups_alive(pgids)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left
