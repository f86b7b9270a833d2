"""launcher/doctor/hosts.py, doctor_checks.py and `zerorun doctor`: every failure class with its
fix on synthetic probe answers, and real checks of this machine through the local runner
(a free port, a port in use, the whole command under 5 s)."""

from __future__ import annotations

import copy
import json
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from launcher.doctor.hosts import check_hosts
from launcher.doctor.verdicts import (
    Problem,
    ifname_matches,
    limit_findings,
    network_findings,
    port_findings,
    ssh_failure,
    suggest_ifname,
    version_findings,
)
from launcher.plan.filters import select
from launcher.plan.hostfile import Host
from launcher.plan.launch_plan import build_plan
from launcher.plan.port import free_port
from launcher.plan.runners import RunnerKind

FACTS: dict[str, Any] = {
    "cwd_ok": True,
    "versions": {"python": "3.11.7", "python_path": "/env/bin/python", "zerorun": "0.1.0", "torch": "2.4.1",
                 "cuda": "12.4", "nccl": "2.21.5", "driver": "550.54"},
    "limits": {"shm": {"total": 8 << 30, "free": 8 << 30}, "memlock": -1, "nofile": 65536, "unlimited": -1, "gpus": 8},
    "network": {"resolved": ["10.77.0.1"], "address": "10.77.0.1", "env": {},
                "route": {"source": "10.77.0.2", "interface": "veth-b", "mtu": 1500},
                "connect": {"result": "ok", "seconds": 0.001}},
}


def _local_plan(port: int) -> Any:
    nodes = select((Host("localhost", 1),))
    return build_plan(nodes, command=("t.py",), job_id="j", cwd=str(Path.cwd()), python=__import__("sys").executable,
                      master_port=port, local=True)


def test_version_mismatch_names_the_host_and_both_versions() -> None:
    other = copy.deepcopy(FACTS)
    other["versions"]["torch"] = "2.3.0"
    other["versions"]["driver"] = "535.1"
    found = version_findings("node-b", other, "node-a", FACTS)
    assert [(f.problem, f.error) for f in found] == [(Problem.TORCH_MISMATCH, True), (Problem.DRIVER_MISMATCH, False)]
    assert found[0].message == "node-b has torch 2.3.0, node-a has 2.4.1"
    assert "/env/bin/python" in found[0].fix
    assert version_findings("node-b", FACTS, "node-a", FACTS) == []


def test_limits_gpus_shm_memlock_open_files() -> None:
    assert limit_findings("n", FACTS, 8) == []
    small = copy.deepcopy(FACTS)
    small["limits"].update(shm={"total": 64 << 20, "free": 64 << 20}, memlock=64 << 10, nofile=1024, gpus=4)
    found = {f.problem: f for f in limit_findings("n", small, 8)}
    assert set(found) == {Problem.GPU_SLOTS, Problem.SHM, Problem.MEMLOCK, Problem.NOFILE}
    assert found[Problem.GPU_SLOTS].message == "n has 8 slots but 4 GPU(s)" and "slots=4" in found[Problem.GPU_SLOTS].fix
    assert found[Problem.SHM].error and "64 MiB" in found[Problem.SHM].message and "--shm-size" in found[Problem.SHM].fix
    assert not found[Problem.MEMLOCK].error and "unlimited" in found[Problem.MEMLOCK].fix
    assert not found[Problem.NOFILE].error


def test_network_classes() -> None:
    assert network_findings("b", FACTS, "m", 29500, False, {}) == []
    loop = copy.deepcopy(FACTS)
    loop["network"]["resolved"] = ["127.0.1.1"]
    assert [f.problem for f in network_findings("b", loop, "m", 29500, False, {})] == [Problem.MASTER_LOOPBACK]
    assert network_findings("a", loop, "m", 29500, True, {}) == []  # on the master itself a loopback name is fine
    unresolved = {**FACTS, "network": {"resolved": [], "error": "cannot resolve 'm'"}}
    assert [f.problem for f in network_findings("b", unresolved, "m", 1, False, {})] == [Problem.NAME_RESOLUTION]
    noroute = copy.deepcopy(FACTS)
    noroute["network"]["route"] = {"error": "ENETUNREACH: Network is unreachable"}
    assert [f.problem for f in network_findings("b", noroute, "m", 1, False, {})] == [Problem.NO_ROUTE]
    wrong = network_findings("b", FACTS, "m", 1, False, {"GLOO_SOCKET_IFNAME": "veth-x"})
    assert [f.problem for f in wrong] == [Problem.WRONG_INTERFACE]
    assert "leaves by veth-b" in wrong[0].message and wrong[0].fix.startswith("set GLOO_SOCKET_IFNAME=veth-b")


def test_port_classes_refused_vs_timed_out() -> None:
    assert port_findings("b", {"result": "timeout", "seconds": 3.0}, "m", 29500, )[0].problem is Problem.PORT_TIMEOUT
    assert port_findings("b", {"result": "refused", "seconds": 0.0}, "m", 29500)[0].problem is Problem.PORT_REFUSED
    assert "nft add rule" in port_findings("b", {"result": "timeout", "seconds": 3.0}, "m", 29500)[0].fix


def test_ssh_failure_classes() -> None:
    cases = {"Host key verification failed.": Problem.HOST_KEY, "user@b: Permission denied (publickey).": Problem.PERMISSION,
             "ssh: Could not resolve hostname b: Name or service not known": Problem.NAME_RESOLUTION,
             "ssh: connect to host b port 22: Connection refused": Problem.UNREACHABLE}
    for text, problem in cases.items():
        assert ssh_failure("b", 255, text).problem is problem, text
    assert ssh_failure("b", 127, "python: not found").problem is Problem.PROBE_FAILED


def test_ifname_grammar_and_suggestion() -> None:
    assert ifname_matches("eth0", "eth") and ifname_matches("eth0", "=eth0") and not ifname_matches("eth01", "=eth0")
    assert not ifname_matches("docker0", "^docker,lo") and ifname_matches("ens5", "^docker,lo")
    assert suggest_ifname(["eth0", "eth0"]) == "eth0" and suggest_ifname(["eth0", "ens5"]) == "ens5,eth0"
    assert suggest_ifname(["lo", "eth0"]) is None


def test_this_machine_is_checked_for_real() -> None:
    report = check_hosts(_local_plan(free_port()), RunnerKind.LOCAL)
    assert report.ok, [f.message for f in report.findings]
    facts = report.hosts[0].facts
    assert facts is not None and facts["network"]["connect"]["result"] == "ok"  # the listener was reached
    assert facts["versions"]["python"] == __import__("platform").python_version()
    assert report.seconds < 5


def test_a_port_in_use_on_the_master_is_found() -> None:
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        report = check_hosts(_local_plan(busy.getsockname()[1]), RunnerKind.LOCAL)
    assert not report.ok
    assert [f.problem for f in report.findings] == [Problem.PORT_IN_USE]
    assert "--master_port" in report.findings[0].fix


def test_doctor_command_json_and_exit_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from zerorun.cli import main

    monkeypatch.chdir(tmp_path)
    start = time.monotonic()
    assert main(["doctor", "--master_port", str(free_port()), "--json"]) == 0
    took = time.monotonic() - start
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] and data["runner"] == "local" and data["verdict"].startswith("ok: 1 host(s)")
    assert took < 5, took
    with socket.socket() as busy:
        busy.bind(("", 0))
        busy.listen()
        assert main(["doctor", "--master-port", str(busy.getsockname()[1])]) == 1
    out = capsys.readouterr().out
    assert "port_in_use" in out and "not ready: 1 error(s) on localhost" in out


def test_the_collective_launch_is_judged() -> None:
    from launcher.doctor.collective import CollectiveReport, judge

    hosts = ["a", "b"]
    ok = '[a:0] zerorun-doctor-collective {"world": 2, "gloo_ok": true, "gloo_seconds": 0.001, "links": []}\n'
    assert judge(hosts, 0, ok, "", 90) == ({"world": 2, "gloo_ok": True, "gloo_seconds": 0.001, "links": []}, [])
    _, hang = judge(hosts, None, "[b:1] waiting\n", "", 90)
    assert [f.problem for f in hang] == [Problem.COLLECTIVE_HANG] and "within 90 s" in hang[0].message
    assert "[b:1] waiting" in hang[0].message and "not only the master port" in hang[0].fix
    _, failed = judge(hosts, 1, "[a:0] RuntimeError: Connection refused\n", "zerorun: rank 0 on a failed (exit code 1)\n", 90)
    assert [f.problem for f in failed] == [Problem.COLLECTIVE_FAILED]
    assert "RuntimeError: Connection refused" in failed[0].message and "rank 0 on a failed" in failed[0].message
    _, wrong = judge(hosts, 0, ok.replace('"gloo_ok": true', '"gloo_ok": false'), "", 90)
    assert "gloo all-reduce over 2 ranks gave a wrong sum" in wrong[0].message
    links = ({"a": "a", "b": "b", "latency_us": 50.0, "bytes_per_s": 2e9},
             {"a": "a", "b": "c", "latency_us": 80.0, "bytes_per_s": 1e8}, {"a": "b", "b": "c", "latency_us": 60.0,
                                                                           "bytes_per_s": 9e8})
    assert CollectiveReport(("a", "b", "c"), {}, (), 1.0, links=links).slowest == links[1]


def test_the_link_matrix_and_the_slowest_link_are_shown() -> None:
    from rich.console import Console

    from launcher.doctor.collective import CollectiveReport
    from zerorun.commands.doctor import show_collective

    links = ({"a": "a", "b": "b", "latency_us": 50.0, "bytes_per_s": 2e9},
             {"a": "a", "b": "c", "latency_us": 80.0, "bytes_per_s": 1e8}, {"a": "b", "b": "c", "latency_us": 60.0,
                                                                           "bytes_per_s": 9e8})
    console = Console(record=True, width=120)
    show_collective(CollectiveReport(("a", "b", "c"), {"world": 6, "gloo_seconds": 0.002}, (), 3.0, links=links), console)
    text = console.export_text()
    assert "all-reduce over 6 ranks ok (gloo 2.0 ms)" in text and "slowest link: a - c (100 MB/s, 80 us)" in text
    assert "50 us, 2000 MB/s" in text and "60 us, 900 MB/s" in text


def test_disks_the_job_writes() -> None:
    from launcher.doctor.verdicts import disk_findings

    def facts(**d: Any) -> dict[str, Any]:
        return {"disks": {"save dir": {"path": "/ckpt", "exists": True, "checked": "/ckpt", "writable": True,
                                       "free": 100 << 30, "total": 200 << 30, **d}}}

    assert disk_findings("n", facts()) == [] and disk_findings("n", {}) == []
    [low] = disk_findings("n", facts(free=5 << 30))
    assert low.problem is Problem.DISK_LOW and not low.error and low.message == "n: save dir /ckpt has 5120 MiB free"
    assert disk_findings("n", facts(free=100 << 20))[0].error
    [ro] = disk_findings("n", facts(writable=False, checked="/"))
    assert ro.problem is Problem.DISK_NOT_WRITABLE and "/ is not writable" in ro.message


def test_doctor_checks_the_save_dir_and_the_configs_nvme_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from zerorun.cli import main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("")
    (tmp_path / "ds.json").write_text(json.dumps({"train_batch_size": 1, "zero_optimization": {
        "stage": 3, "offload_param": {"device": "nvme", "nvme_path": "swap"}}}))
    argv = ["doctor", "--master_port", str(free_port()), "--config", "ds.json", "--json"]
    assert main([*argv, "--save-dir", "a_file/ckpt"]) == 1  # under a file: cannot be made
    data = json.loads(capsys.readouterr().out)
    disks = data["hosts"][0]["facts"]["disks"]
    assert disks["offload_param.nvme_path"]["path"] == str(tmp_path / "swap") and disks["offload_param.nvme_path"]["free"] > 0
    assert [(f["class"], f["message"].split(" cannot")[0]) for f in data["findings"] if f["severity"] == "error"] == [
        ("disk_not_writable", f"localhost: save dir {tmp_path / 'a_file' / 'ckpt'}")]


def test_the_probe_finds_nccls_wheel_by_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from launcher.doctor.probe_script import NCCL_WHEELS, nccl_wheel

    # the first name looked up, ahead of any real one on sys.path (torch's CUDA wheels install one)
    name = NCCL_WHEELS[0]
    info = tmp_path / f"{name.replace('-', '_')}-2.21.5.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 2.21.5\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert nccl_wheel() == "2.21.5"


def test_a_collective_launch_past_its_time_is_stopped() -> None:
    import sys

    from launcher.doctor.collective import _run

    start = time.monotonic()
    code, out, _ = _run([sys.executable, "-c", "import time; print('[a:0] started', flush=True); time.sleep(30)"], 1.5)
    assert code is None and "[a:0] started" in out  # SIGTERM ended it; what it printed is kept for the message
    assert time.monotonic() - start < 10
