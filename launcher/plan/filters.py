"""Resource filters: ``--include``/``--exclude`` (DeepSpeed's grammar plus slot ranges),
``--num_nodes`` and ``--num_gpus``. Pure functions of the hosts and the flag text.

Grammar: ``spec ( "@" spec )*``, ``spec := HOST [ ":" SLOT ("," SLOT)* ]``,
``SLOT := N | N-M`` (inclusive). ``HOST`` is the host as in the hostfile (without
``user@``), an IPv6 address in brackets, e.g. ``[fe80::1]:0,1``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from launcher.errors import FilterError
from launcher.plan.hostfile import Host
from launcher.plan.hostnames import MAX_SLOTS, host_problem, small_number


@dataclass(frozen=True)
class NodeSlots:
    """A host and the slot ids (device indices) selected on it."""

    host: Host
    slots: tuple[int, ...]


_SPEC_RE = re.compile(r"^(?P<name>\[[^\]]+\]|[^:\[\]]+)(?::(?P<slots>.*))?$")


def _parse_slot_list(text: str, spec: str, flag: str) -> set[int]:
    """The slot ids of ``text``; a range is bounded (MAX_SLOTS) before it is expanded."""
    slots: set[int] = set()
    for item in text.split(","):
        match = re.fullmatch(r"(\d+)(?:-(\d+))?", item.strip(), flags=re.ASCII)
        if not match:
            raise FilterError(
                f"{flag} {spec[:80]!r}: bad slot {item[:40]!r}",
                "slots are numbers or ranges separated by commas, e.g. `host1:0,1` or `host1:0-3`",
            )
        lo = small_number(match.group(1))
        hi = small_number(match.group(2)) if match.group(2) is not None else lo
        if lo is None or hi is None or hi >= MAX_SLOTS:
            raise FilterError(f"{flag} {spec[:80]!r}: slot {item[:40]!r} is past the {MAX_SLOTS} slots a host may have",
                              "slot ids run from 0 to the host's slots-1, e.g. `host1:0-7`")
        if hi < lo:
            raise FilterError(f"{flag} {spec!r}: range {item!r} runs backwards", f"write it as `{hi}-{lo}`")
        slots.update(range(lo, hi + 1))
    return slots


def parse_filter(text: str, flag: str = "--include") -> dict[str, set[int] | None]:
    """``"h1:0,1@h2"`` -> ``{"h1": {0, 1}, "h2": None}`` (None = the whole host); specs merge."""
    if not text.strip():
        raise FilterError(f"{flag} is empty", f"give hosts, e.g. {flag} 'host1:0,1@host2'")
    result: dict[str, set[int] | None] = {}
    for spec in text.split("@"):
        spec = spec.strip()
        match = _SPEC_RE.match(spec)
        if not spec or not match:
            raise FilterError(f"{flag} {text[:80]!r}: bad entry {spec[:80]!r}",
                              "separate hosts with `@`: `host1:0,1@host2`")
        name = match.group("name").strip()
        problem = host_problem(name)
        if problem is not None:
            raise FilterError(f"{flag} {text[:80]!r}: bad host {name[:80]!r}: {problem}",
                              "name a host of the hostfile, e.g. `worker-1:0,1@worker-2`")
        if match.group("slots") is None:
            result[name] = result.get(name)
            continue
        slots = _parse_slot_list(match.group("slots"), spec, flag)
        previous = result.get(name)
        result[name] = slots if previous is None else previous | slots
    return result


def _lookup(hosts: tuple[Host, ...], name: str, flag: str) -> Host:
    for host in hosts:
        if name in (host.name, host.address, f"[{host.address}]"):
            return host
    known = ", ".join(h.address for h in hosts)
    raise FilterError(f"{flag}: host {name!r} is not in the hostfile", f"known hosts: {known}")


def _check_range(host: Host, slots: set[int], flag: str) -> None:
    bad = sorted(s for s in slots if s >= host.slots)
    if bad:
        raise FilterError(
            f"{flag}: slot {bad[0]} of host {host.address!r} is out of range (it has slots={host.slots}, ids 0-{host.slots - 1})",
            "pick slot ids below the host's slot count",
        )


def select(hosts: tuple[Host, ...], include: str | None = None, exclude: str | None = None) -> tuple[NodeSlots, ...]:
    """Apply ``--include`` or ``--exclude`` (mutually exclusive); result keeps hostfile order."""
    if include and exclude:
        raise FilterError(
            "--include and --exclude are mutually exclusive", "use one of them: --include keeps, --exclude removes"
        )
    for host in hosts:  # a host made from --num_gpus or a Slurm count, not only from a hostfile line
        if not 0 < host.slots <= MAX_SLOTS:
            raise FilterError(f"host {host.address!r} with {host.slots} slots: a host has 1 to {MAX_SLOTS}",
                              f"give --num_gpus (or the host's slots) from 1 to {MAX_SLOTS}")
    chosen: dict[str, set[int]] = {}
    if include:
        for name, slots in parse_filter(include, "--include").items():
            host = _lookup(hosts, name, "--include")
            if slots is not None:
                _check_range(host, slots, "--include")
            chosen[host.address] = set(range(host.slots)) if slots is None else slots
    else:
        chosen = {h.address: set(range(h.slots)) for h in hosts}
        for name, slots in (parse_filter(exclude, "--exclude") if exclude else {}).items():
            host = _lookup(hosts, name, "--exclude")
            if slots is not None:
                _check_range(host, slots, "--exclude")
            chosen[host.address] -= set(range(host.slots)) if slots is None else slots
    nodes = tuple(NodeSlots(h, tuple(sorted(chosen[h.address]))) for h in hosts if chosen.get(h.address))
    if not nodes:
        flag = f"--include {include!r}" if include else f"--exclude {exclude!r}"
        raise FilterError(f"{flag} leaves no hosts and no slots to run on", "keep at least one slot of one host")
    return nodes


def limit(nodes: tuple[NodeSlots, ...], num_nodes: int | None = None, num_gpus: int | None = None) -> tuple[NodeSlots, ...]:
    """Keep the first ``num_nodes`` nodes and the first ``num_gpus`` slots of each (DeepSpeed's meaning)."""
    if num_nodes is not None:
        if num_nodes < 1:
            raise FilterError(f"--num_nodes {num_nodes}: needs at least 1", "give a positive number of nodes")
        if num_nodes > len(nodes):
            raise FilterError(
                f"--num_nodes {num_nodes} is larger than the {len(nodes)} node(s) available",
                f"use --num_nodes {len(nodes)} or add hosts to the hostfile",
            )
        nodes = nodes[:num_nodes]
    if num_gpus is not None:
        if num_gpus < 1:
            raise FilterError(f"--num_gpus {num_gpus}: needs at least 1", "give a positive number of slots per node")
        for node in nodes:
            if num_gpus > len(node.slots):
                raise FilterError(
                    f"--num_gpus {num_gpus} is larger than the {len(node.slots)} slot(s) available on {node.host.address!r}",
                    f"use --num_gpus {min(len(n.slots) for n in nodes)} or raise that host's slots",
                )
        nodes = tuple(NodeSlots(n.host, n.slots[:num_gpus]) for n in nodes)
    return nodes


def check_exclusive(include: str | None, exclude: str | None, num_nodes: int | None, num_gpus: int | None) -> None:
    """DeepSpeed's rule: --num_nodes/--num_gpus do not combine with --include/--exclude."""
    if (include or exclude) and (num_nodes is not None or num_gpus is not None):
        flag = "--include" if include else "--exclude"
        other = "--num_nodes" if num_nodes is not None else "--num_gpus"
        raise FilterError(f"{flag} and {other} cannot be combined", f"select slots with {flag} alone, or drop it")
