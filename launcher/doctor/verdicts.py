"""The doctor's verdicts: each host's probe answer (launcher/doctor/probe_script.py) judged into
classified findings, each with its fix. Pure functions of data, tested on exact text.

Errors mean a launch would fail (the doctor exits 1); warnings mean it would start but
may fail or slow down later. The classes are listed in docs/doctor.md.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from launcher.plan.master import is_loopback

Facts = Mapping[str, Any]
"""One host's probe answer as parsed JSON (the keys probe_script.py writes)."""

MIN_SHM = 256 << 20
"""Below this /dev/shm (Docker's default is 64 MiB), ranks sharing a node fail to allocate their buffers."""
LOW_SHM = 1 << 30
MIN_NOFILE = 4096
MIN_DISK = 1 << 30
"""Below this free under a path the job writes, a save or a swap file fails at once (an error)."""
LOW_DISK = 10 << 30
"""Below this, a warning: a checkpoint of a model of a few billion parameters does not fit."""
MAX_SKEW = 2.0
"""Seconds of clock offset, beyond the measurement's own uncertainty, that make logs and timeouts disagree."""


class Problem(str, Enum):
    """The failure classes (docs/doctor.md has the fix of each)."""

    UNREACHABLE = "host_unreachable"
    HOST_KEY = "host_key"
    PERMISSION = "permission_denied"
    NAME_RESOLUTION = "name_resolution"
    PROBE_FAILED = "probe_failed"
    NO_WORKDIR = "no_working_directory"
    PYTHON_MISMATCH = "python_mismatch"
    ZERORUN_MISMATCH = "zerorun_mismatch"
    TORCH_MISMATCH = "torch_mismatch"
    DRIVER_MISMATCH = "driver_mismatch"
    GPU_SLOTS = "gpus_fewer_than_slots"
    SHM = "shm_too_small"
    MEMLOCK = "memlock_low"
    NOFILE = "open_files_low"
    CLOCK_SKEW = "clock_skew"
    MASTER_LOOPBACK = "master_resolves_to_loopback"
    NO_ROUTE = "no_route"
    WRONG_INTERFACE = "wrong_interface"
    PORT_IN_USE = "port_in_use"
    PORT_REFUSED = "port_refused"
    PORT_TIMEOUT = "port_blocked"
    DISK_LOW = "disk_low"
    DISK_NOT_WRITABLE = "disk_not_writable"
    COLLECTIVE_FAILED = "collective_failed"
    COLLECTIVE_HANG = "collective_hang"


@dataclass(frozen=True)
class Finding:
    """One problem on one host: its class, what was seen, and the fix."""

    host: str
    problem: Problem
    message: str
    fix: str
    error: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "class": self.problem.value, "severity": "error" if self.error else "warning",
                "message": self.message, "fix": self.fix}


def ssh_failure(host: str, returncode: int, stderr: str) -> Finding:
    """A host whose probe did not answer: ssh's own text decides the class."""
    text = stderr.strip() or "(no output)"
    low = text.lower()
    if "host key verification failed" in low or "remote host identification has changed" in low:
        return Finding(host, Problem.HOST_KEY, f"{host}: ssh refused the host key: {text}",
                       f"check the key, then `ssh-keyscan {host} >> ~/.ssh/known_hosts` (or remove the stale line)")
    if "permission denied" in low:
        return Finding(host, Problem.PERMISSION, f"{host}: ssh permission denied: {text}",
                       f"install a key without a passphrase prompt: `ssh-copy-id {host}` (the launcher uses BatchMode)")
    if "could not resolve hostname" in low or "name or service not known" in low:
        return Finding(host, Problem.NAME_RESOLUTION, f"{host}: the name does not resolve here: {text}",
                       "fix the hostfile's name, /etc/hosts or DNS")
    if returncode == 255:
        return Finding(host, Problem.UNREACHABLE, f"{host} is not reachable over ssh: {text}",
                       "check that the host is up, sshd runs and the ssh port (--ssh_port) is open")
    return Finding(host, Problem.PROBE_FAILED, f"{host}: the probe failed (status {returncode}): {text}",
                   "run the same Python (the launcher's path) on every host, with zerorun installed")


def version_findings(host: str, facts: Facts, ref_host: str, ref: Facts) -> list[Finding]:
    """Versions that must agree with the first host's (the master's): both versions named."""
    found = []
    checks = (("python", Problem.PYTHON_MISMATCH, "Python"), ("zerorun", Problem.ZERORUN_MISMATCH, "zerorun"),
              ("torch", Problem.TORCH_MISMATCH, "torch"), ("cuda", Problem.TORCH_MISMATCH, "torch's CUDA"),
              ("nccl", Problem.TORCH_MISMATCH, "NCCL"), ("driver", Problem.DRIVER_MISMATCH, "the NVIDIA driver"))
    mine, theirs = facts["versions"], ref["versions"]
    for key, problem, name in checks:
        if mine.get(key) != theirs.get(key):
            found.append(Finding(
                host, problem, f"{host} has {name} {mine.get(key) or 'none'}, {ref_host} has {theirs.get(key) or 'none'}",
                f"install the same {name} on every host (same environment path: {theirs.get('python_path')})",
                error=key != "driver"))
    return found


def limit_findings(host: str, facts: Facts, slots: int) -> list[Finding]:
    """GPUs against slots, /dev/shm, ``ulimit -l`` and ``-n``."""
    lim, found = facts["limits"], []
    if lim["gpus"] and slots > lim["gpus"]:
        found.append(Finding(host, Problem.GPU_SLOTS, f"{host} has {slots} slots but {lim['gpus']} GPU(s)",
                             f"write `slots={lim['gpus']}` for {host} in the hostfile"))
    shm = lim.get("shm")
    if shm and shm["total"] < LOW_SHM:
        too_small = slots > 1 and shm["total"] < MIN_SHM
        found.append(Finding(host, Problem.SHM, f"{host}: /dev/shm is {shm['total'] >> 20} MiB",
                             "give the container more (`docker run --shm-size=8g`, Kubernetes: an emptyDir "
                             "with medium Memory) or remount: `mount -o remount,size=8G /dev/shm`", error=too_small))
    if lim["gpus"] and lim["memlock"] != lim["unlimited"]:
        found.append(Finding(host, Problem.MEMLOCK, f"{host}: ulimit -l is {lim['memlock'] >> 10} KiB",
                             "pinned memory and RDMA want `ulimit -l unlimited` (memlock in "
                             "/etc/security/limits.conf, or `docker run --ulimit memlock=-1`)", error=False))
    if lim["nofile"] != lim["unlimited"] and lim["nofile"] < MIN_NOFILE:
        found.append(Finding(host, Problem.NOFILE, f"{host}: ulimit -n is {lim['nofile']}",
                             "raise it: `ulimit -n 65536` (nofile in /etc/security/limits.conf)", error=False))
    return found


def disk_findings(host: str, facts: Facts) -> list[Finding]:
    """Each path the job writes (the save dir, the NVMe swap folders): writable, with room."""
    found = []
    for label, d in sorted((facts.get("disks") or {}).items()):
        where = f"{host}: {label} {d['path']}"
        if "error" in d or not d["writable"]:
            found.append(Finding(host, Problem.DISK_NOT_WRITABLE, f"{where} cannot be written "
                                 f"({d.get('error') or d['checked'] + ' is not writable'})",
                                 f"create {d['path']} with write access for this user on {host}, or choose another path"))
        elif d["free"] < LOW_DISK:
            found.append(Finding(host, Problem.DISK_LOW, f"{where} has {d['free'] >> 20} MiB free",
                                 "free space there or choose another path (checkpoints and NVMe swap files are "
                                 "several bytes per parameter)", error=d["free"] < MIN_DISK))
    return found


def clock_finding(host: str, offset: float, uncertainty: float) -> Finding | None:
    if abs(offset) - uncertainty <= MAX_SKEW:
        return None
    return Finding(host, Problem.CLOCK_SKEW, f"{host}'s clock is {offset:+.1f} s off this machine's",
                   "run a time service (chrony, systemd-timesyncd) on every host", error=False)


def ifname_matches(name: str, spec: str) -> bool:
    """NCCL's grammar: a comma list of prefixes; ``^`` excludes them; ``=`` makes them exact."""
    exclude, spec = spec.startswith("^"), spec.lstrip("^")
    exact, spec = spec.startswith("="), spec.lstrip("=")
    hit = any(name == p if exact else name.startswith(p) for p in spec.split(",") if p)
    return hit != exclude


def network_findings(host: str, facts: Facts, master: str, port: int, with_master: bool,
                     ifname_env: Mapping[str, str]) -> list[Finding]:
    """The master as ``host`` resolves it, its route there, the interface the user named, the port.

    ``with_master``: ``host`` is the master's machine (there a loopback master is fine)."""
    net = facts["network"]
    if not net.get("resolved"):
        return [Finding(host, Problem.NAME_RESOLUTION, f"{host}: {net.get('error')}",
                        f"make {master} resolve on every host (/etc/hosts or DNS), or give --master_addr as an address")]
    if not with_master and any(is_loopback(a) for a in net["resolved"]):
        return [Finding(host, Problem.MASTER_LOOPBACK, f"{host} resolves the master {master} to {net['resolved']}: "
                        "its ranks would connect to themselves",
                        f"fix {master}'s entry in {host}'s /etc/hosts (a 127.0.1.1 line), or pass --master_addr as an address")]
    found, rt = [], net["route"]
    if "error" in rt:
        return [Finding(host, Problem.NO_ROUTE, f"{host} has no route to the master {net['address']}: {rt['error']}",
                        "add a route or an interface on the master's network, or choose a --master_addr this host reaches")]
    env = {**net.get("env", {}), **ifname_env}  # what the launcher exports wins over the host's own
    for var, spec in sorted(env.items()):
        if rt.get("interface") not in (None, "lo") and not ifname_matches(rt["interface"], spec):
            found.append(Finding(host, Problem.WRONG_INTERFACE,
                                 f"{host}: {var}={spec}, but the route to the master {net['address']} leaves by "
                                 f"{rt['interface']} ({rt['source']})", f"set {var}={rt['interface']}, or unset it"))
    found += port_findings(host, net.get("connect"), net["address"], port)
    return found


def port_findings(host: str, result: Mapping[str, Any] | None, addr: str, port: int) -> list[Finding]:
    if not result or result["result"] == "ok":
        return []
    kind = result["result"]
    if kind == "timeout":
        return [Finding(host, Problem.PORT_TIMEOUT, f"{host}: connecting to the master {addr}:{port} timed out "
                        f"after {result['seconds']:.1f} s: a firewall drops the packets",
                        f"open TCP port {port} (and the ranks' ephemeral ports) between the hosts, e.g. "
                        f"`nft add rule inet filter input tcp dport {port} accept`, or pick an open --master_port")]
    if kind == "refused":
        return [Finding(host, Problem.PORT_REFUSED, f"{host}: the master {addr}:{port} refused the connection while "
                        "the doctor listened there: a firewall rejects it, or the address is another machine's",
                        f"open TCP port {port} on the master, and check that {addr} is rank 0's node")]
    if kind == "no_route":
        return [Finding(host, Problem.NO_ROUTE, f"{host}: no route to the master {addr}: {result.get('error')}",
                        "check the network between the hosts, or choose a --master_addr this host reaches")]
    return [Finding(host, Problem.PORT_REFUSED, f"{host}: connecting to {addr}:{port} failed: {result.get('error')}",
                    f"check TCP port {port} between the hosts")]


def suggest_ifname(routes: Sequence[str | None]) -> str | None:
    """The ``*_SOCKET_IFNAME`` value that matches every host's route to the master, or None."""
    names = sorted({r for r in routes if r})
    if not names or "lo" in names:
        return None
    return ",".join(names)
