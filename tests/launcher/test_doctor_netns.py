"""The doctor with real network separation: two "hosts" are Linux network namespaces the
test creates (``m``: 10.77.1.1, ``b``: 10.77.1.2, joined by a veth pair; ``b`` also has a
veth 10.77.9.2 whose peer leads nowhere), each running its own sshd. The doctor runs
inside ``m`` as a user would on the master. Checked: a clean verdict, an interface that
does not route (found, and the right one suggested), a port dropped by nftables on the
master (blocked, timed out; the only finding, so the rest is clean), a master address where
nothing listens (refused), a launch whose ranks get their node's own routing interface as
NCCL_/GLOO_SOCKET_IFNAME (said in one line), and a loopback first node replaced by the real route's
address. Traffic stays inside the namespaces. Skips, with the reason, where namespaces
cannot be made (not root, no `ip`, no permission)."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
ADDRS = {"m": "10.77.1.1", "b": "10.77.1.2"}
pytestmark = pytest.mark.netns  # counted in the run's summary (tests/conftest.py)


@dataclass(frozen=True)
class Netns:
    names: dict[str, str]
    key: Path
    root: Path

    def run(self, where: str, *argv: str, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", "netns", "exec", self.names[where], *argv], cwd=cwd, capture_output=True,
                              text=True, timeout=timeout)

    def ssh_args(self, config: Path | None = None) -> list[str]:
        opts = f"-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR -i {self.key}"
        return ["--launcher", "ssh", "--ssh_args", opts + (f" -F {config}" if config else "")]


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, text=True)


def _sshd(root: Path, ns: str, addr: str, port: int = 22, *extra: str) -> subprocess.Popen[bytes]:
    config = root / f"sshd_{addr}_{port}"
    config.write_text("\n".join([
        f"Port {port}", f"ListenAddress {addr}", f"HostKey {root / 'host_key'}", *extra,
        f"AuthorizedKeysFile {root / 'authorized_keys'}", "PermitRootLogin prohibit-password",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no", "StrictModes no",
        f"PidFile {root / f'pid_{addr}_{port}'}", "MaxStartups 100", "",
    ]))
    return subprocess.Popen(["ip", "netns", "exec", ns, SSHD, "-D", "-f", str(config), "-E", str(root / f"log_{addr}_{port}")])


def _make(names: dict[str, str]) -> None:
    for ns in names.values():
        _ip("netns", "add", ns)
        _ip("-n", ns, "link", "set", "lo", "up")
    m, b = names["m"], names["b"]
    _ip("-n", m, "link", "add", "vm0", "type", "veth", "peer", "name", "vb0", "netns", b)
    _ip("-n", m, "addr", "add", f"{ADDRS['m']}/24", "dev", "vm0")
    _ip("-n", b, "addr", "add", f"{ADDRS['b']}/24", "dev", "vb0")
    _ip("-n", b, "link", "add", "dum0", "type", "veth", "peer", "name", "dum1")  # leads nowhere (no dummy driver everywhere)
    _ip("-n", b, "addr", "add", "10.77.9.2/24", "dev", "dum0")
    for ns, dev in ((m, "vm0"), (b, "vb0"), (b, "dum0"), (b, "dum1")):
        _ip("-n", ns, "link", "set", dev, "up")


def _sweep_stale() -> None:
    """Namespaces an earlier run left behind (killed before its teardown): its pid is gone."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
    for name in listed:
        pid = name[3:]
        if name[:3] in ("zrm", "zrb") and pid.isdigit() and not Path(f"/proc/{pid}").exists():
            subprocess.run(["ip", "netns", "del", name], capture_output=True)


def _stop(procs: list[subprocess.Popen[bytes]], names: dict[str, str]) -> None:
    """Every sshd gone, then the namespaces (their veths go with them), whatever failed before."""
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=3)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for ns in names.values():
        for pid in subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split():
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid), signal.SIGKILL)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


@pytest.fixture(scope="module")
def netns(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Netns]:
    if os.geteuid() != 0 or not shutil.which("ip") or not os.path.exists(SSHD):
        pytest.skip("network namespaces need root, iproute2 and openssh-server")
    _sweep_stale()
    names = {k: f"zr{k}{os.getpid()}" for k in ADDRS}
    procs: list[subprocess.Popen[bytes]] = []
    try:
        try:
            _make(names)
        except subprocess.CalledProcessError as err:
            pytest.skip(f"cannot create network namespaces here: {err.stderr.strip()}")
        root = tmp_path_factory.mktemp("netns")
        for name in ("host_key", "user_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(root / name)], check=True)
        (root / "authorized_keys").write_text((root / "user_key.pub").read_text())
        Path("/run/sshd").mkdir(parents=True, exist_ok=True)
        procs += [_sshd(root, names[k], addr) for k, addr in ADDRS.items()]
        shim = root / "shim" / "zerorun-9.9.9.dist-info"  # host b seen through port 2222 has another zerorun
        shim.mkdir(parents=True)
        (shim / "METADATA").write_text("Metadata-Version: 2.1\nName: zerorun\nVersion: 9.9.9\n")
        procs.append(_sshd(root, names["b"], ADDRS["b"], 2222, f"SetEnv PYTHONPATH={shim.parent}"))
        env = Netns(names, root / "user_key", root)
        deadline = time.monotonic() + 15
        probe = "import socket,sys; socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=0.5).close()"
        for addr, port in (*((a, "22") for a in ADDRS.values()), (ADDRS["b"], "2222")):
            while env.run("m", sys.executable, "-c", probe, addr, port, cwd=root).returncode != 0:
                assert time.monotonic() < deadline, f"sshd on {addr} did not start"
                time.sleep(0.1)
        yield env
    finally:
        _stop(procs, names)


def _doctor(env: Netns, tmp_path: Path, *extra: str, config: Path | None = None) -> dict:
    (tmp_path / "hostfile").write_text("10.77.1.1 slots=1\n10.77.1.2 slots=1\n")
    out = env.run("m", sys.executable, "-m", "zerorun.cli", "doctor", "-H", "hostfile", *env.ssh_args(config),
                  "--master_port", "29531", "--json", *extra, cwd=tmp_path)
    data = json.loads(out.stdout)
    assert out.returncode == (0 if data["ok"] else 1), out.stderr
    return data


def test_the_interface_that_routes_and_one_that_does_not(netns: Netns, tmp_path: Path) -> None:
    data = _doctor(netns, tmp_path, "--env", "GLOO_SOCKET_IFNAME=dum0")
    routes = {h["host"]: h["facts"]["network"]["route"] for h in data["hosts"]}
    assert routes["10.77.1.2"]["interface"] == "vb0" and routes["10.77.1.2"]["source"] == "10.77.1.2"
    assert routes["10.77.1.1"]["interface"] == "vm0" and routes["10.77.1.2"]["mtu"] == 1500
    assert data["ifname_suggestion"] == "vb0,vm0"
    assert not data["ok"]  # the one error: the interface named does not route (everything else is clean)
    assert [(f["host"], f["class"]) for f in data["findings"]] == [("10.77.1.1", "wrong_interface"),
                                                                   ("10.77.1.2", "wrong_interface")]
    wrong = data["findings"][1]
    assert "GLOO_SOCKET_IFNAME=dum0, but the route to the master 10.77.1.1 leaves by vb0 (10.77.1.2)" in wrong["message"]
    assert wrong["fix"].startswith("set GLOO_SOCKET_IFNAME=vb0")


def test_a_port_dropped_on_the_master_is_blocked(netns: Netns, tmp_path: Path) -> None:
    if not shutil.which("nft"):
        pytest.skip("needs nftables (Debian's nftables package)")
    m = netns.names["m"]
    rules = ("add table inet zrtest\n"
             "add chain inet zrtest input { type filter hook input priority 0 ; }\n"
             "add rule inet zrtest input ip saddr 10.77.1.2 tcp dport 29531 drop\n")
    subprocess.run(["ip", "netns", "exec", m, "nft", "-f", "-"], input=rules, text=True, check=True)
    try:
        data = _doctor(netns, tmp_path)
    finally:
        subprocess.run(["ip", "netns", "exec", m, "nft", "delete", "table", "inet", "zrtest"], check=True)
    assert not data["ok"]
    assert [(f["host"], f["class"]) for f in data["findings"]] == [("10.77.1.2", "port_blocked")]
    assert "timed out" in data["findings"][0]["message"]


def test_a_master_where_nothing_listens_is_refused(netns: Netns, tmp_path: Path) -> None:
    data = _doctor(netns, tmp_path, "--master_addr", ADDRS["b"])  # rank 0 (and the listener) on m, the master b
    assert not data["ok"]
    assert [(f["host"], f["class"]) for f in data["findings"]] == [("10.77.1.1", "port_refused"),
                                                                   ("10.77.1.2", "port_refused")]
    assert "10.77.1.2:29531 refused the connection" in data["findings"][0]["message"]
    # the refusal is probed again once the listener is up (no retry then), not retried for ssh's timeout
    assert all(h["facts"]["network"]["connect"]["seconds"] < 1.0 for h in data["hosts"])


def test_a_loopback_first_node_becomes_the_routed_address(netns: Netns, tmp_path: Path) -> None:
    (tmp_path / "hostfile").write_text("localhost slots=1\n10.77.1.2 slots=1\n")
    out = netns.run("m", sys.executable, "-m", "zerorun.cli", "-H", "hostfile", *netns.ssh_args(), "--dry-run", "--json",
                    "t.py", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["master_addr"] == "10.77.1.1"
    assert "zerorun: master 10.77.1.1 instead of localhost" in out.stderr


@pytest.mark.timeout(100)
def test_a_launch_exports_each_nodes_routing_interface(netns: Netns, tmp_path: Path) -> None:
    (tmp_path / "hostfile").write_text("10.77.1.1 slots=1\n10.77.1.2 slots=1\n")
    (tmp_path / "env.py").write_text("import os\nprint('ifnames', os.environ.get('NCCL_SOCKET_IFNAME'), "
                                     "os.environ.get('GLOO_SOCKET_IFNAME'))\n")  # no torch: the env is the point
    out = netns.run("m", sys.executable, "-m", "zerorun.cli", "-H", "hostfile", *netns.ssh_args(), "--master_port",
                    "29532", "env.py", cwd=tmp_path, timeout=100)
    assert out.returncode == 0, out.stdout + out.stderr
    assert ("zerorun: NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME unset: each node's ranks use the interface of its "
            "route to the master (10.77.1.1: vm0, 10.77.1.2: vb0)") in out.stderr
    assert "[10.77.1.1:0] ifnames vm0 vm0" in out.stdout and "[10.77.1.2:1] ifnames vb0 vb0" in out.stdout


def test_a_version_mismatch_names_the_host_and_both_versions(netns: Netns, tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text("Host 10.77.1.2\n  Port 2222\n")  # b's sshd that puts a shim zerorun on PYTHONPATH
    data = _doctor(netns, tmp_path, config=config)
    assert not data["ok"]
    assert [(f["host"], f["class"]) for f in data["findings"]] == [("10.77.1.2", "zerorun_mismatch")]
    from importlib.metadata import version

    assert data["findings"][0]["message"] == f"10.77.1.2 has zerorun 9.9.9, 10.77.1.1 has {version('zerorun')}"
