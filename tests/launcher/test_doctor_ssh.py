"""The doctor over real ssh (the sshd of launcher_conftest on 127.0.0.2 and 127.0.0.3): both
"hosts" checked in parallel, the real collective over both (all-reduce, the link matrix), and a multi-node launch whose master port is taken fails in
the preflight, before any rank starts, with the class and the fix."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import pytest
from launcher_conftest import SCRIPTS, SshServer, sshd, zerorun_argv  # noqa: F401

from launcher.plan.port import free_port


def _ssh(server: SshServer) -> list[str]:
    return ["--launcher", "ssh", "--ssh_port", str(server.port), "--ssh_args", server.ssh_args]


def test_doctor_checks_both_hosts_over_ssh(sshd: SshServer, tmp_path: Path) -> None:  # noqa: F811
    hostfile = sshd.hostfile(tmp_path / "hostfile")
    argv = zerorun_argv("doctor", "-H", str(hostfile), *_ssh(sshd), "--master_port", str(free_port()), "--json",
                        "--no-collective")
    start = time.monotonic()
    out = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    took = time.monotonic() - start
    assert out.returncode == 0, out.stdout + out.stderr
    data = json.loads(out.stdout)
    assert data["ok"] and data["runner"] == "ssh" and [h["host"] for h in data["hosts"]] == ["127.0.0.2", "127.0.0.3"]
    for host in data["hosts"]:
        net = host["facts"]["network"]
        assert net["resolved"] == ["127.0.0.2"] and net["connect"]["result"] == "ok"  # reached the listener
        assert net["route"]["interface"] == "lo"
    assert took < 15, took


@pytest.mark.timeout(240)
def test_doctor_runs_a_real_collective_and_names_the_slowest_link(sshd: SshServer, tmp_path: Path) -> None:  # noqa: F811
    hostfile = sshd.hostfile(tmp_path / "hostfile", slots=1)  # two nodes: the collective is on by default
    argv = zerorun_argv("doctor", "-H", str(hostfile), *_ssh(sshd), "--master_port", str(free_port()), "--json")
    out = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=220)
    assert out.returncode == 0, out.stdout + out.stderr
    data = json.loads(out.stdout)
    assert data["verdict"].endswith("all-reduce over 2 ranks ok, slowest link 127.0.0.2 - 127.0.0.3")
    c = data["collective"]
    assert c["ran"] and c["findings"] == [] and c["result"]["world"] == 2 and c["result"]["gloo_ok"]
    [link] = c["links"]  # one pair of nodes, measured for real
    assert (link["a"], link["b"]) == ("127.0.0.2", "127.0.0.3") and link["bytes_per_s"] > 0 and link["latency_us"] > 0
    assert c["slowest"] == link


def test_launch_with_the_master_port_taken_fails_before_any_rank(sshd: SshServer, tmp_path: Path) -> None:  # noqa: F811
    hostfile = sshd.hostfile(tmp_path / "hostfile")
    with socket.socket() as busy:
        busy.bind(("127.0.0.2", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = zerorun_argv("-H", str(hostfile), *_ssh(sshd), "--master_port", str(port),
                            str(SCRIPTS / "allreduce.py"))
        out = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1, out.stdout + out.stderr
    assert f"[port_in_use] port {port} is in use on the master 127.0.0.2" in out.stderr
    assert "--no_preflight" in out.stderr
    assert "rank 0/4" not in out.stdout  # no rank ran
