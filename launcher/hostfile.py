"""Hostfile parsing (DeepSpeed's format), a pure function of the file's text.

``host slots=N`` per line; ``#`` starts a comment (whole line or trailing); blank lines
are skipped; ``user@host`` and ``[ipv6]`` are accepted. Every error names
``file:line`` and quotes the offending text. Hosts keep file order: global ranks are
assigned contiguously per host in that order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import HostfileError

DEFAULT_HOSTFILE = "/job/hostfile"
"""Used when ``--hostfile`` is not given and this file exists (DeepSpeed's default)."""

_HOST_RE = re.compile(
    r"^(?:(?P<user>[A-Za-z0-9._-]+)@)?(?P<addr>\[[0-9A-Fa-f:.%A-Za-z]+\]|[A-Za-z0-9._-]+)$"
)
_IGNORED_KEYS = frozenset({"max_slots"})  # Open MPI's key: accepted so one file serves both


@dataclass(frozen=True)
class Host:
    """One hostfile entry. ``name`` is the text as written: the ssh/pdsh target."""

    name: str
    slots: int
    line: int = 0

    @property
    def address(self) -> str:
        """The host without ``user@`` and without IPv6 brackets (what ranks connect to)."""
        match = _HOST_RE.match(self.name)
        addr = match.group("addr") if match else self.name
        return addr[1:-1] if addr.startswith("[") else addr


def _strip_comment(line: str) -> str:
    return line.split("#", 1)[0].strip()


def _parse_slots(value: str, where: str, raw: str) -> int:
    if not re.fullmatch(r"[+-]?\d+", value):
        raise HostfileError(
            f"{where}: slots must be a whole number, got {value!r} in {raw!r}",
            "write the line as `host slots=N`, for example `worker-1 slots=8`",
        )
    slots = int(value)
    if slots <= 0:
        raise HostfileError(
            f"{where}: slots={slots} in {raw!r}; a host needs at least one slot",
            "give the number of GPUs (or CPU ranks) on that host, or delete the line",
        )
    return slots


def _parse_line(raw: str, where: str, lineno: int) -> Host | None:
    text = _strip_comment(raw)
    if not text:
        return None
    name, *rest = text.split()
    if ":" in name and not name.split("@")[-1].startswith("["):
        raise HostfileError(
            f"{where}: bad host {name!r} in {raw.strip()!r}",
            "write IPv6 addresses in brackets (`[fe80::1] slots=4`) and slots as `slots=N`, not `host:N`",
        )
    if not _HOST_RE.match(name):
        raise HostfileError(f"{where}: bad host {name!r} in {raw.strip()!r}", "a host is `name`, `user@name` or `[ipv6]`")
    slots: int | None = None
    for token in rest:
        key, sep, value = token.partition("=")
        if sep and key == "slots" and slots is None:
            slots = _parse_slots(value, where, raw.strip())
        elif not (sep and key in _IGNORED_KEYS):
            raise HostfileError(
                f"{where}: unexpected {token!r} in {raw.strip()!r}",
                "each line is `host slots=N` (no spaces around `=`); comments start with `#`",
            )
    if slots is None:
        raise HostfileError(f"{where}: no slots in {raw.strip()!r}", "write the line as `host slots=N`")
    return Host(name=name, slots=slots, line=lineno)


def parse_hostfile(text: str, source: str = "<hostfile>") -> tuple[Host, ...]:
    """Parse hostfile ``text``; ``source`` names the file in errors."""
    hosts: list[Host] = []
    seen: dict[str, Host] = {}
    for lineno, raw in enumerate(text.splitlines(), start=1):
        host = _parse_line(raw, f"{source}:{lineno}", lineno)
        if host is None:
            continue
        if host.address in seen:
            first = seen[host.address]
            raise HostfileError(
                f"{source}:{lineno}: duplicate host {host.name!r} (line {lineno} duplicates line {first.line})",
                "list each host once and give it all its slots: `host slots=N`",
            )
        seen[host.address] = host
        hosts.append(host)
    if not hosts:
        raise HostfileError(
            f"{source}: the hostfile lists no hosts (only blank lines or comments)",
            "add a line `host slots=N` per machine, or drop --hostfile to run on this machine",
        )
    return tuple(hosts)


def read_hostfile(path: str | Path) -> tuple[Host, ...]:
    """Read and parse the hostfile at ``path``; a missing file is an error."""
    p = Path(path)
    if p.is_dir():
        raise HostfileError(f"hostfile {str(path)!r} is a directory, not a file",
                            "pass the file inside it, e.g. --hostfile hostfiles/two-nodes")
    if not p.is_file():
        raise HostfileError(
            f"hostfile {str(path)!r} does not exist",
            "check the path; without --hostfile (and without /job/hostfile) zerorun runs on this machine only",
        )
    return parse_hostfile(p.read_text(), str(path))


def find_hosts(hostfile: str | None, default: str = DEFAULT_HOSTFILE) -> tuple[Host, ...] | None:
    """The hosts of ``--hostfile`` (must exist), else of ``default`` if present, else None (local)."""
    if hostfile is not None:
        return read_hostfile(hostfile)
    if Path(default).is_file():
        return read_hostfile(default)
    return None
