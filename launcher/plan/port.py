"""The master port: a free one when the user named none and the job runs here, a taken one refused.

A second job on the same machine (two experiments on GPUs 0,1 and 2,3) would find the
default port 29500 held by the first job's store, and every rank would die in torch's
25-line ``EADDRINUSE`` traceback. So, as torchrun's ``--standalone`` does, a job whose
ranks all run on this machine and that names no ``--master_port`` takes 29500 if it is
free, else a free port, and says which. A port the user named that is already taken
here stops the launch before any rank starts, in one line with the fix. For a job with
other nodes the port is the store's on the master node, which only the preflight (ssh)
or ``zerorun doctor`` can check, so 29500 stays the default there.
"""

from __future__ import annotations

import contextlib
import random
import socket
import sys
from pathlib import Path

from launcher.errors import LaunchError
from launcher.plan.launch_plan import DEFAULT_MASTER_PORT

AUTO = "auto"


_OUTGOING = Path("/proc/sys/net/ipv4/ip_local_port_range")
_SPAN = 8192  # the ports tried just below the outgoing range


def outgoing_ports() -> range:
    """The local ports the kernel gives outgoing connections (Linux's ``ip_local_port_range``; else the
    IANA dynamic range, which other systems use)."""
    try:
        low, high = (int(x) for x in _OUTGOING.read_text().split())
    except (OSError, ValueError):
        low, high = 49152, 65535
    return range(low, high + 1)


def free_port(tries: int = 64) -> int:
    """A port no one listens on here now, outside the outgoing range: the kernel's own pick comes from
    that range, so any connection opened here between the pick and the store's listen can take it as its
    local port (seen: ``EADDRINUSE`` with four jobs of many gloo connections on one machine)."""
    outgoing = outgoing_ports()
    near = (*range(outgoing.start - _SPAN, outgoing.start), *range(outgoing.stop, 65536))
    candidates = [p for p in near if p >= 1024]  # never a privileged port, whatever the range says
    for port in random.sample(candidates, min(tries, len(candidates))):
        if not in_use(port):
            return port
    with socket.socket() as s:  # all taken: the kernel's pick
        s.bind(("", 0))
        return int(s.getsockname()[1])


def in_use(port: int) -> bool:
    """Whether a store could not listen on ``port`` here: something holds it on any address.

    Bound as torch's TCPStore binds (``SO_REUSEADDR``, so a port in TIME_WAIT counts as free),
    on IPv4 and, where there is one, IPv6."""
    for family, addr in ((socket.AF_INET, ""), (socket.AF_INET6, "::")):
        try:
            s = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue  # no IPv6 here
        with s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                with contextlib.suppress(OSError):
                    s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                s.bind((addr, port))
                s.listen(1)
            except OSError as e:
                if e.errno in (98, 48, 10048):  # EADDRINUSE (Linux, macOS, Windows)
                    return True
                continue  # another refusal (a privileged port, no IPv6 address): the store will say
    return False


def taken_error(port: int) -> LaunchError:
    return LaunchError(f"--master_port {port} is in use on this machine (another job's store?)",
                       "drop --master_port to take a free port, or pass --master_port auto; "
                       f"`ss -ltnp 'sport = :{port}'` shows what holds it")


def choose_port(text: str | None, here: bool, check: bool = True) -> tuple[int, str | None]:
    """``(port, reason)`` for ``--master_port text`` (None: not given).

    ``here``: every rank runs on this machine, so its ports are the store's ports.
    ``check``: refuse a named port that is taken here (off for a dry run, which starts nothing).
    The reason (None for the default, or the port the user named) goes into the plan."""
    if text == AUTO:
        return free_port(), "auto: a free port on this machine"
    if text is None:
        if not here or not in_use(DEFAULT_MASTER_PORT):
            return DEFAULT_MASTER_PORT, None
        port = free_port()
        print(f"zerorun: port {DEFAULT_MASTER_PORT} is in use on this machine (another job?): this job's store "
              f"takes free port {port} (--master_port N pins one)", file=sys.stderr, flush=True)
        return port, f"{DEFAULT_MASTER_PORT} was in use here: a free port instead"
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise LaunchError(f"--master_port {text!r} is not a port", "give 1-65535, or `auto` for a free port")
    port = int(text)
    if here and check and in_use(port):
        raise taken_error(port)
    return port, None
