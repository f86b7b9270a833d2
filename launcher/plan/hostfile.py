"""Hostfile parsing (DeepSpeed's format), a pure function of the file's text.

``host slots=N`` per line; ``#`` starts a comment (whole line or trailing); blank lines
are skipped; ``user@host`` and ``[ipv6]`` are accepted (launcher/plan/hostnames.py holds the
grammar: nothing starts with ``-``). Every bad line is reported in one pass, each
error naming ``file:line``, quoting the text and saying the fix. Hosts keep file order: global ranks are
assigned contiguously per host in that order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from launcher.errors import HostfileError
from launcher.plan.hostnames import MAX_SLOTS, bare_address, host_problem, small_number

DEFAULT_HOSTFILE = "/job/hostfile"
"""Used when ``--hostfile`` is not given and this file exists (DeepSpeed's default)."""

_IGNORED_KEYS = frozenset({"max_slots"})  # Open MPI's key: accepted so one file serves both
_FORMAT = "each line is `host slots=N`, e.g. `worker-1 slots=8`; comments start with `#`"


@dataclass(frozen=True)
class Host:
    """One hostfile entry. ``name`` is the text as written: the ssh/pdsh target."""

    name: str
    slots: int
    line: int = 0

    @property
    def address(self) -> str:
        """The host without ``user@`` and without IPv6 brackets (what ranks connect to)."""
        return bare_address(self.name)


class _LineError(Exception):
    """One bad line: the problem and its fix (collected, then raised together)."""

    def __init__(self, problem: str, fix: str) -> None:
        super().__init__(problem)
        self.problem, self.fix = problem, fix


def _strip_comment(line: str) -> str:
    return line.split("#", 1)[0].strip()


def check_slots(value: str, shown: str) -> int:
    """``value`` as a slot count in 1..MAX_SLOTS (checked before it is converted, let alone expanded)."""
    if not re.fullmatch(r"[+-]?\d+", value, flags=re.ASCII):
        raise _LineError(f"slots must be a whole number, got {value[:40]!r} in {shown}",
                         "write the line as `host slots=N`, for example `worker-1 slots=8`")
    slots = small_number(value.lstrip("+")) if not value.startswith("-") else -1
    if slots is None or slots > MAX_SLOTS:
        raise _LineError(f"slots={value[:40]} in {shown} is more than the {MAX_SLOTS} slots a host may have",
                         "give the number of GPUs (or CPU ranks) on that host")
    if slots <= 0:
        raise _LineError(f"slots={value} in {shown}; a host needs at least one slot",
                         "give the number of GPUs (or CPU ranks) on that host, or delete the line")
    return slots


def _parse_line(raw: str, lineno: int) -> Host | None:
    text = _strip_comment(raw)
    if not text:
        return None
    shown = repr(raw.strip()[:120])
    name, *rest = text.split()
    problem = host_problem(name)
    if problem is not None:
        raise _LineError(f"bad host {name[:80]!r} in {shown}: {problem}",
                         "a host is `name`, `user@name`, an IPv4 address or `[ipv6]`")
    slots: int | None = None
    for token in rest:
        key, sep, value = token.partition("=")
        if sep and key == "slots" and slots is None:
            slots = check_slots(value, shown)
        elif not (sep and key in _IGNORED_KEYS):
            raise _LineError(f"unexpected {token[:40]!r} in {shown}", f"{_FORMAT} (no spaces around `=`)")
    if slots is None:
        raise _LineError(f"no slots in {shown}", "write the line as `host slots=N`")
    return Host(name=name, slots=slots, line=lineno)


def parse_hostfile(text: str, source: str = "<hostfile>") -> tuple[Host, ...]:
    """Parse hostfile ``text``; ``source`` names the file in errors.

    Every bad line is reported at once, each with ``source:line``, the problem and its fix.
    """
    hosts: list[Host] = []
    seen: dict[str, Host] = {}
    errors: list[str] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        try:
            host = _parse_line(raw, lineno)
        except _LineError as e:
            errors.append(f"{source}:{lineno}: {e.problem}\n  fix: {e.fix}")
            continue
        if host is None:
            continue
        if host.address in seen:
            first = seen[host.address]
            errors.append(f"{source}:{lineno}: duplicate host {host.name!r} (line {lineno} duplicates line {first.line})"
                          "\n  fix: list each host once and give it all its slots: `host slots=N`")
            continue
        seen[host.address] = host
        hosts.append(host)
    if errors:
        many = f"{len(errors)} bad lines" if len(errors) > 1 else "a bad line"
        raise HostfileError("\n".join(errors), f"the hostfile {source} has {many}; {_FORMAT}")
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
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise HostfileError(f"hostfile {str(path)!r} cannot be read as text: {e}",
                            "give a UTF-8 text file of `host slots=N` lines") from None
    return parse_hostfile(text, str(path))


def find_hosts(hostfile: str | None, default: str = DEFAULT_HOSTFILE) -> tuple[Host, ...] | None:
    """The hosts of ``--hostfile`` (must exist), else of ``default`` if present, else None (local)."""
    if hostfile is not None:
        return read_hostfile(hostfile)
    if Path(default).is_file():
        return read_hostfile(default)
    return None
