"""launcher/plan/ifname.py: each node's routing interface exported to its own ranks, only for the
variables nobody set, and carried by the plan's JSON to the agents."""

from __future__ import annotations

from launcher.plan.filters import select
from launcher.plan.hostfile import Host
from launcher.plan.ifname import describe, export_ifnames, node_ifnames, unset_vars, with_ifnames
from launcher.plan.launch_plan import LaunchPlan, build_plan, rank_env


def _plan(env: dict[str, str] | None = None) -> LaunchPlan:
    nodes = select((Host("a", 1), Host("b", 2)))
    return build_plan(nodes, command=("t.py",), job_id="j", cwd="/", python="python", env=env)


def _facts(iface: str | None, env: dict[str, str] | None = None) -> dict:
    return {"network": {"route": {"interface": iface} if iface else {"error": "ENETUNREACH"}, "env": env or {}}}


def test_each_node_gets_its_own_interface() -> None:
    plan = _plan()
    facts = [_facts("eth0"), _facts("ens5")]
    assert node_ifnames(plan, facts) == {0: "eth0", 1: "ens5"}
    out, ifnames, variables = export_ifnames(plan, facts)
    assert variables == ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")
    assert rank_env(out, 0, 0, False)["GLOO_SOCKET_IFNAME"] == "eth0"
    assert rank_env(out, 1, 1, False)["NCCL_SOCKET_IFNAME"] == "ens5"
    assert LaunchPlan.from_dict(out.to_dict()) == out  # the agents read the same
    assert with_ifnames(_plan(), ifnames, variables) == out
    assert "a: eth0, b: ens5" in describe(plan, ifnames, variables)
    assert "eth0 on every node" in describe(plan, {0: "eth0", 1: "eth0"}, variables)


def test_nothing_is_exported_over_what_was_set_or_when_unknown() -> None:
    assert unset_vars(_plan({"NCCL_SOCKET_IFNAME": "ib"}), [_facts("eth0"), _facts("eth0")]) == ("GLOO_SOCKET_IFNAME",)
    assert unset_vars(_plan(), [_facts("eth0"), _facts("eth0", {"GLOO_SOCKET_IFNAME": "x"})]) == ("NCCL_SOCKET_IFNAME",)
    assert node_ifnames(_plan(), [_facts("eth0"), _facts(None)]) == {}  # one node's route unknown: no advice
    assert node_ifnames(_plan(), [_facts("lo"), _facts("lo")]) == {}  # all on this machine
    plan = _plan()
    assert export_ifnames(plan, [_facts("eth0"), None]) == (plan, {}, ())
