"""A one-machine Slurm cluster for the launcher tests (imported by tests/launcher/test_launcher_slurm.py).

``slurm`` (session scope) writes a slurm.conf into a temporary directory - this machine
as the one node, its own ports, state and spool directories - and starts ``slurmctld``
and ``slurmd`` on it, as root. Authentication is ``auth/none`` when the packaged Slurm
still ships that plugin (Debian 12's 22.05 does); otherwise a ``munged`` with a freshly
generated key and its own socket. Clients find the cluster through ``SLURM_CONF``
(``SlurmCluster.env``). The daemons stop, and every job is cancelled, at the end.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from launcher.plan.port import free_port

DAEMONS = ("slurmctld", "slurmd", "srun", "salloc", "sbatch", "scancel", "scontrol", "sinfo")
PLUGIN_DIRS = ("/usr/lib/*/slurm-wlm", "/usr/lib/slurm-wlm", "/usr/lib64/slurm", "/usr/lib/slurm")


@dataclass(frozen=True)
class SlurmCluster:
    conf: Path
    node: str
    env: dict[str, str]


def skip_loudly(what: str, reason: str) -> None:
    """A skip that shows in the summary (-ra) and as a warning line, never silently."""
    text = f"{what} NOT TESTED: {reason}"
    print(f"\nWARNING: {text}", file=sys.stderr)
    warnings.warn(text, stacklevel=2)
    pytest.skip(text)


def _has_auth_none() -> bool:
    return any(glob.glob(os.path.join(d, "auth_none.so")) for d in PLUGIN_DIRS)


def _start_munge(root: Path) -> tuple[subprocess.Popen[bytes], list[str]]:
    """munged with a new key and a private socket; the slurm.conf lines that use it."""
    munged = shutil.which("munged") or "/usr/sbin/munged"
    if not os.path.exists(munged):
        skip_loudly("Slurm", "this Slurm has no auth/none plugin and munge is not installed (scripts/setup.sh)")
    key, sock = root / "munge.key", root / "munge.socket"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o400)
    proc = subprocess.Popen([munged, "-F", "--force", f"--key-file={key}", f"--socket={sock}",
                             f"--pid-file={root / 'munged.pid'}", f"--seed-file={root / 'munge.seed'}",
                             f"--log-file={root / 'munged.log'}"])
    return proc, ["AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={sock}"]


def write_conf(root: Path, node: str, auth: list[str]) -> Path:
    cpus = max(4, os.cpu_count() or 1)  # 2-rank tests fit on a 1-CPU machine (config_overrides)
    lines = [
        "ClusterName=zerorun-test", f"SlurmctldHost={node}(127.0.0.1)",
        f"SlurmctldPort={free_port()}", f"SlurmdPort={free_port()}", "SlurmUser=root", "SlurmdUser=root", *auth,
        "MpiDefault=none", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "SchedulerType=sched/builtin", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
        "SlurmdParameters=config_overrides", "ReturnToService=2", "KillWait=3", "MessageTimeout=10",
        f"StateSaveLocation={root / 'state'}", f"SlurmdSpoolDir={root / 'spool'}",
        f"SlurmctldPidFile={root / 'slurmctld.pid'}", f"SlurmdPidFile={root / 'slurmd.pid'}",
        f"SlurmctldLogFile={root / 'slurmctld.log'}", f"SlurmdLogFile={root / 'slurmd.log'}",
        f"NodeName={node} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN",
        f"PartitionName=test Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES",
    ]
    conf = root / "slurm.conf"
    conf.write_text("\n".join(lines) + "\n")
    return conf


def _wait_idle(env: dict[str, str], deadline: float) -> str:
    state = ""
    while time.monotonic() < deadline:
        out = subprocess.run(["sinfo", "-h", "-o", "%t"], env=env, capture_output=True, text=True)
        state = out.stdout.strip() or out.stderr.strip()
        if state == "idle":
            return state
        time.sleep(0.2)
    return state


def _logs(root: Path) -> str:
    return " | ".join(f"{p.name}: {p.read_text()[-400:]}" for p in sorted(root.glob("*.log")))


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in reversed(procs):
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in reversed(procs):
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.fixture(scope="session")
def slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SlurmCluster]:
    missing = [d for d in DAEMONS if not shutil.which(d) and not os.path.exists(f"/usr/sbin/{d}")]
    if missing:
        skip_loudly("Slurm", f"{', '.join(missing)} not installed (scripts/setup-tests.sh installs slurm-wlm)")
    if os.geteuid() != 0:
        skip_loudly("Slurm", "slurmd must run as root to start jobs (CI runs as root)")
    root = tmp_path_factory.mktemp("slurm")
    (root / "state").mkdir()
    (root / "spool").mkdir()
    node = socket.gethostname().split(".")[0]
    procs: list[subprocess.Popen[bytes]] = []
    auth = ["AuthType=auth/none", "CredType=cred/none"]
    if not _has_auth_none() or os.environ.get("ZERORUN_TEST_SLURM_AUTH") == "munge":
        munge, auth = _start_munge(root)
        procs.append(munge)
        time.sleep(0.5)
    conf = write_conf(root, node, auth)
    env = {**os.environ, "SLURM_CONF": str(conf)}
    for key in [k for k in env if k.startswith("SLURM_") and k != "SLURM_CONF"]:
        del env[key]  # the tests make their own allocations
    sbin = "/usr/sbin"
    quiet = {"env": env, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}  # they log to root/*.log
    procs.append(subprocess.Popen([shutil.which("slurmctld") or f"{sbin}/slurmctld", "-D", "-i", "-f", str(conf)],
                                  **quiet))
    procs.append(subprocess.Popen([shutil.which("slurmd") or f"{sbin}/slurmd", "-D", "-N", node, "-f", str(conf)],
                                  **quiet))
    try:
        state = _wait_idle(env, time.monotonic() + 30)
        if state != "idle":
            skip_loudly("Slurm", f"the one-node cluster did not come up (node state {state!r}); {_logs(root)}")
        yield SlurmCluster(conf, node, env)
    finally:
        subprocess.run(["scancel", "--full", "--user", "root"], env=env, capture_output=True)
        _stop(procs)
