"""The socket interface of every node's ranks: ``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME`` set,
per node, to the interface of that node's route to the master, when the user set neither.

Left to themselves, NCCL and gloo pick an interface by their own rules (the first
non-loopback one, or the host name's address), which on a machine with several cards
(docker0, a management network) can be one that does not reach the other nodes: the
job then hangs at its first collective. The doctor's probe already knows, on every
host, which interface the kernel uses toward the master, so the launcher exports that
one. Per node, not one list for all: gloo opens *every* interface a comma list names,
and fails on a host that lacks one of them.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from launcher.plan.launch_plan import LaunchPlan

IFNAME_VARS = ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")


def node_ifnames(plan: LaunchPlan, facts: Sequence[Mapping[str, Any] | None]) -> dict[int, str]:
    """``{node_rank: interface}`` of each node's route to the master; empty when any node's is
    unknown or loopback (the nodes are this machine: nothing to choose)."""
    found: dict[int, str] = {}
    for node, f in zip(plan.nodes, facts, strict=True):
        name = ((f or {}).get("network") or {}).get("route", {}).get("interface")
        if not name or name == "lo":
            return {}
        found[node.node_rank] = name
    return found


def unset_vars(plan: LaunchPlan, facts: Sequence[Mapping[str, Any] | None]) -> tuple[str, ...]:
    """The interface variables neither the launch exports (its env, --env, env files) nor any host sets."""
    user = {k for k, _ in plan.env}
    hosts = {k for f in facts if f for k in (f.get("network") or {}).get("env", {})}
    return tuple(v for v in IFNAME_VARS if v not in user | hosts)


def with_ifnames(plan: LaunchPlan, ifnames: Mapping[int, str], variables: Sequence[str]) -> LaunchPlan:
    """``plan`` whose nodes' ranks get ``variables`` set to their node's interface."""
    if not ifnames or not variables:
        return plan
    nodes = tuple(dataclasses.replace(n, env=(*n.env, *((v, ifnames[n.node_rank]) for v in variables)))
                  for n in plan.nodes)
    return dataclasses.replace(plan, nodes=nodes)


def describe(plan: LaunchPlan, ifnames: Mapping[int, str], variables: Sequence[str]) -> str:
    """The one line that says what was exported."""
    names = set(ifnames.values())
    where = (f"{names.pop()} on every node" if len(names) == 1 else
             ", ".join(f"{plan.nodes[r].host}: {n}" for r, n in sorted(ifnames.items())))
    return (f"zerorun: {' and '.join(variables)} unset: each node's ranks use the interface of its route to the "
            f"master ({where}); set {'them' if len(variables) > 1 else 'it'} with --env to choose otherwise")


def export_ifnames(plan: LaunchPlan, facts: Sequence[Mapping[str, Any] | None]) -> tuple[LaunchPlan, dict[int, str], tuple[str, ...]]:
    """The plan with the interfaces exported (said on stderr), the interfaces and the variables set."""
    ifnames, variables = node_ifnames(plan, facts), unset_vars(plan, facts)
    if not ifnames or not variables:
        return plan, {}, ()
    print(describe(plan, ifnames, variables), file=sys.stderr)
    return with_ifnames(plan, ifnames, variables), ifnames, variables
