"""The master address every rank can reach: a loopback master with a remote node is never planned.

``localhost``/``127.x``/``::1`` as the master works when every rank runs on this
machine; with a node elsewhere, that node's ranks would connect to themselves and wait
for a store that is not there. As DeepSpeed's runner does, a loopback *first node*
(the implicit master) is replaced by this machine's routable address: the source
address of the route toward the first remote node (a UDP ``connect`` only asks the
kernel for the route, it sends no packet), else the first of ``hostname -I``. An
*explicit* loopback ``--master_addr`` with a remote node is the user's mistake, so it is
an error that names the fix. The pure checks are here; ``plan.choose_master`` applies
them, so no plan holds a loopback master with a remote node.
"""

from __future__ import annotations

import contextlib
import ipaddress
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence

from launcher.errors import LaunchError
from launcher.plan.filters import NodeSlots

_LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


def is_loopback(addr: str) -> bool:
    """Whether ``addr`` (a bare address or name, no ``user@``) is a loopback literal."""
    text = addr.strip("[]").split("%", 1)[0].lower()
    if text in _LOOPBACK_NAMES or text.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        return False


def is_here(addr: str) -> bool:
    """Whether ``addr`` names this machine: a loopback literal or one of its host names."""
    return is_loopback(addr) or addr.lower() in {socket.gethostname().lower(), socket.getfqdn().lower()}


def remote_nodes(nodes: Sequence[NodeSlots]) -> list[str]:
    """The addresses of nodes that are not this machine (not loopback, not its host names)."""
    return [n.host.address for n in nodes if not is_here(n.host.address)]


def check_explicit(master_addr: str, nodes: Sequence[NodeSlots]) -> None:
    """An explicit loopback ``--master_addr`` with a remote node: a LaunchError naming the fix."""
    remote = remote_nodes(nodes)
    if is_loopback(master_addr) and remote:
        raise LaunchError(
            f"--master_addr {master_addr} is a loopback address, but node {remote[0]} is another machine: "
            "its ranks would connect to themselves",
            f"give the address of rank 0's node that {remote[0]} can reach (`hostname -I` there), "
            "or drop --master_addr to let the launcher choose",
        )


def source_address(toward: str) -> str | None:
    """This machine's address on the route toward ``toward`` (no packet is sent), or None."""
    with contextlib.suppress(OSError, UnicodeError):
        family, _, _, _, sockaddr = socket.getaddrinfo(toward, 9, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as s:
            s.connect(sockaddr)  # UDP: picks the route and source address, transmits nothing
            addr = str(s.getsockname()[0])
            return None if is_loopback(addr) else addr
    return None


def first_hostname_address() -> str | None:
    """The first address ``hostname -I`` lists (DeepSpeed's choice), or None."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=2).stdout.split()
        return next((a for a in out if not is_loopback(a)), None)
    return None


def routable_master(
    nodes: Sequence[NodeSlots],
    master_addr: str | None,
    local: bool,
    route: Callable[[str], str | None] | None = None,
) -> tuple[str, str] | None:
    """``(address, reason)`` replacing a loopback first node when another node is remote, else None.

    ``route(remote)`` gives this machine's address toward ``remote`` (default: source_address).
    Raises LaunchError for an explicit loopback ``--master_addr`` with a remote node, or
    when no routable address of this machine can be found.
    """
    if master_addr:
        check_explicit(master_addr, nodes)
        return None
    remote = remote_nodes(nodes)
    first = nodes[0].host
    if local or not remote or not is_loopback(first.address):
        return None
    addr = (route or source_address)(remote[0]) or first_hostname_address()
    if addr is None:
        raise LaunchError(
            f"the first node of the hostfile ({first.name}) is a loopback name, node {remote[0]} is another "
            "machine, and no routable address of this machine was found",
            "write this machine's routable name or address in the hostfile, or pass --master_addr",
        )
    return addr, (f"first node of the hostfile ({first.name}) is loopback and {remote[0]} is remote: "
                  f"its address toward {remote[0]} instead")


def plan_master(nodes: Sequence[NodeSlots], master_addr: str | None, local: bool) -> tuple[str | None, str | None]:
    """The ``(master_addr, master_reason)`` to plan with; says in one line when a loopback master is replaced."""
    replaced = routable_master(nodes, master_addr, local)
    if replaced is None:
        return master_addr, None
    print(f"zerorun: master {replaced[0]} instead of {nodes[0].host.address}: {replaced[1]}", file=sys.stderr)
    return replaced
