"""The grammar of a host, wherever one comes from (hostfile, ``--include``/``--exclude``,
``--master_addr``, a Slurm node list), and the bounds on slot counts and ranges.

A host is ``[user@]ADDR``; ``ADDR`` is a host name (dot-separated labels of letters,
digits, ``_`` and inner ``-``), an IPv4 address, or an IPv6 address in brackets
(``[fe80::1%eth0]``). Nothing may start with ``-``: ssh and pdsh would read
``-Fevil`` as an option (a config file that sets a ProxyCommand runs anything). The
runners also put ``--`` before every ssh destination, so the check and the command
line each hold on their own.
"""

from __future__ import annotations

import ipaddress
import re

_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_NAME_RE = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_USER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,31}")
MAX_HOST = 253
MAX_SLOTS = 4096
"""The most slots one host may have: far above any machine's GPUs or sensible CPU ranks,
and small enough that expanding ``0-(MAX_SLOTS-1)`` is instant."""
MAX_RANKS = 1 << 20
"""The largest rank id ``--ranks`` may name."""
MAX_CORES = 1 << 16
"""The largest core id ``--bind_core_list`` may name."""
MAX_DIGITS = 9
"""Longest number read from a slot, rank or core list (checked before ``int()`` sees it)."""


def address_problem(addr: str) -> str | None:
    """Why ``addr`` (no ``user@``) is not a host name or address, or None."""
    if not addr:
        return "it is empty"
    if addr.startswith("-"):
        return "a host cannot start with '-' (ssh would read it as an option)"
    if addr.startswith("[") and addr.endswith("]"):
        try:
            ipaddress.IPv6Address(addr[1:-1])
        except ValueError:
            return f"{addr[1:-1]!r} is not an IPv6 address"
        return None
    if ":" in addr:
        return "write an IPv6 address in brackets (`[fe80::1]`), and slots as `slots=N`, not `host:N`"
    if len(addr) > MAX_HOST or not _NAME_RE.fullmatch(addr):
        return "a host name is letters, digits, '_', inner '-' and dots (or an IPv4 address, or [IPv6])"
    if re.fullmatch(r"[\d.]+", addr):
        try:
            ipaddress.IPv4Address(addr)
        except ValueError:
            return f"{addr!r} is not an IPv4 address"
    return None


def host_problem(host: str) -> str | None:
    """Why ``host`` (``[user@]ADDR``) cannot be a host, or None."""
    user, at, addr = host.rpartition("@")
    if at and not _USER_RE.fullmatch(user):
        return f"user {user!r}: a user name is letters, digits, '.', '_', '-' and cannot start with '-' or '.'"
    return address_problem(addr)


def bare_address(host: str) -> str:
    """``user@[fe80::1]`` -> ``fe80::1``: what ranks connect to."""
    addr = host.rpartition("@")[2]
    return addr[1:-1] if addr.startswith("[") and addr.endswith("]") else addr


def small_number(text: str) -> int | None:
    """``text`` as a non-negative int if it is at most MAX_DIGITS decimal digits, else None."""
    return int(text) if text.isascii() and text.isdigit() and len(text) <= MAX_DIGITS else None


def bounded_range(item: str, limit: int) -> range | None:
    """``"3"`` or ``"2-5"`` as a range below ``limit``; None if it is not one (checked before expanding)."""
    lo_text, sep, hi_text = item.strip().partition("-")
    lo = small_number(lo_text)
    hi = small_number(hi_text) if sep else lo
    if lo is None or hi is None or hi < lo or hi >= limit:
        return None
    return range(lo, hi + 1)
