"""launcher/plan/master.py: a loopback master with a remote node is never planned. A loopback
first node is replaced by this machine's routable address (said in one line); an explicit
loopback --master_addr with a remote node is refused, naming the fix, before any rank starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from launcher.errors import LaunchError
from launcher.plan.filters import select
from launcher.plan.hostfile import parse_hostfile
from launcher.plan.launch_plan import build_plan
from launcher.plan.master import is_loopback, routable_master

MIXED = select(parse_hostfile("localhost slots=2\nnode-b slots=2\n", "hf"))


def test_loopback_literals() -> None:
    for addr in ("localhost", "LOCALHOST", "127.0.0.1", "127.3.4.5", "::1", "[::1]", "ip6-localhost", "a.localhost"):
        assert is_loopback(addr), addr
    for addr in ("node-b", "10.77.0.1", "fe80::1", "localhostx", "192.0.2.7"):
        assert not is_loopback(addr), addr


def test_loopback_first_node_is_replaced_by_the_route_toward_the_remote_node() -> None:
    asked: list[str] = []
    got = routable_master(MIXED, None, local=False, route=lambda to: asked.append(to) or "10.77.0.1")
    assert asked == ["node-b"]
    assert got is not None and got[0] == "10.77.0.1"
    assert "localhost" in got[1] and "node-b is remote" in got[1]
    all_local = select(parse_hostfile("localhost slots=1\n127.0.0.3 slots=1\n", "hf"))
    assert routable_master(all_local, None, local=False, route=lambda to: "x") is None  # every node is this machine
    first_remote = select(parse_hostfile("node-a slots=1\nlocalhost slots=1\n", "hf"))
    assert routable_master(first_remote, None, local=False, route=lambda to: "x") is None  # master node-a is fine


@pytest.mark.parametrize("addr", ["localhost", "127.0.0.1", "::1"])
def test_explicit_loopback_master_with_a_remote_node_is_refused(addr: str) -> None:
    with pytest.raises(LaunchError) as info:
        routable_master(MIXED, addr, local=False)
    assert f"--master_addr {addr} is a loopback address, but node node-b is another machine" in info.value.message
    assert "drop --master_addr" in info.value.hint
    with pytest.raises(LaunchError, match="loopback"):  # the pure plan holds the rule on its own too
        build_plan(MIXED, command=("t.py",), job_id="j", cwd="/", python="py", master_addr=addr)
    with pytest.raises(LaunchError, match="first node of the hostfile \\(localhost\\) is loopback"):
        build_plan(MIXED, command=("t.py",), job_id="j", cwd="/", python="py")


def test_launch_plans_a_routable_master_and_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from launcher.main import main
    from launcher.plan import master

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(master, "source_address", lambda to: "10.77.0.1")  # no route lookup in the test
    (tmp_path / "hosts").write_text("localhost slots=2\nnode-b slots=2\n")
    assert main(["-H", "hosts", "--launcher", "ssh", "--dry-run", "--json", "t.py"]) == 0
    out, err = capsys.readouterr()
    plan = json.loads(out)
    assert plan["master_addr"] == "10.77.0.1", plan
    assert err.count("\n") == 1 and "zerorun: master 10.77.0.1 instead of localhost" in err
    with pytest.raises(LaunchError, match="--master_addr 127.0.0.1 is a loopback address"):
        main(["-H", "hosts", "--launcher", "ssh", "--master_addr", "127.0.0.1", "--dry-run", "t.py"])
