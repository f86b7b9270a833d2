"""Elastic membership (``--nnodes MIN:MAX``): which nodes run the next attempt. Pure.

The pool is the selected hosts in hostfile order; an attempt runs on the first nodes of
the pool that are in, as many as give the largest valid world (the global batch can be
kept there) with at least MIN and at most MAX nodes; the others are spares. After a
failure:

* the node whose rank failed first sits out the next attempt (its ranks died: it is
  the suspect, even when its host still answers the checks); a node that failed the
  same way twice (the same exit status) is out for the rest of the run;
* a host that fails the checks (unreachable, other versions, the port) is out too;
* with ``--rejoin`` every host that sat out and answers the checks again is back at the
  restart after (never a host that is out for good); without it, out is out;
* when no valid world with MIN nodes is left without the suspect, it runs again (a
  restart of the same gang beats giving up).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from launcher.errors import LaunchError
from launcher.plan.filters import NodeSlots

WorldCheck = Callable[[int], str | None]
"""The problem with running at world ``n`` (None: the config runs there)."""


@dataclass(frozen=True)
class NodeRange:
    """``--nnodes MIN:MAX`` (or ``--min_nodes``/``--max_nodes``)."""

    min_nodes: int
    max_nodes: int

    def __str__(self) -> str:
        return f"{self.min_nodes}:{self.max_nodes}"


def parse_nnodes(text: str | None, min_nodes: int | None, max_nodes: int | None) -> NodeRange | None:
    """The range from the flags (None: not an elastic launch); ``LaunchError`` for a bad one."""
    if text is None and min_nodes is None and max_nodes is None:
        return None
    low, high = min_nodes, max_nodes
    if text is not None:
        head, sep, tail = text.partition(":")
        if not head.isdigit() or (sep and not tail.isdigit()) or (min_nodes or max_nodes):
            raise LaunchError(f"--nnodes {text[:40]!r} is not N or MIN:MAX (and goes without --min_nodes/--max_nodes)",
                              "give --nnodes 2:4 (2 to 4 nodes), or --min_nodes 2 --max_nodes 4")
        low, high = int(head), int(tail) if sep else int(head)
    low = low if low is not None else 1
    if high is None or low < 1 or high < low:
        raise LaunchError(f"--nnodes {low}:{high}: needs 1 <= MIN <= MAX", "give e.g. --nnodes 2:4, or both "
                          "--min_nodes and --max_nodes")
    return NodeRange(low, high)


def world_of(nodes: Iterable[NodeSlots]) -> int:
    return sum(len(n.slots) for n in nodes)


def largest_valid(avail: list[NodeSlots], rng: NodeRange, check: WorldCheck) -> tuple[NodeSlots, ...] | None:
    """The first k of ``avail`` for the largest k in [MIN, MAX] whose world the config runs at."""
    for count in range(min(rng.max_nodes, len(avail)), rng.min_nodes - 1, -1):
        if check(world_of(avail[:count])) is None:
            return tuple(avail[:count])
    return None


@dataclass(frozen=True)
class Change:
    """One restart's membership decision, for the log line and the summary."""

    members: tuple[NodeSlots, ...]
    out: dict[str, str]
    """Host name -> why it is not in (this restart's news only)."""
    back: tuple[str, ...]


@dataclass
class Membership:
    pool: tuple[NodeSlots, ...]
    rng: NodeRange
    rejoin: bool = False
    sitting_out: dict[str, str] = field(default_factory=dict)
    """Hosts out until a ``--rejoin`` restart, with why."""
    gone: dict[str, str] = field(default_factory=dict)
    """Hosts out for the rest of the run, with why."""
    strikes: dict[tuple[str, int], int] = field(default_factory=dict)

    def first(self, check: WorldCheck) -> tuple[NodeSlots, ...]:
        """The first attempt's members; ``LaunchError`` naming the worlds when none is valid."""
        avail = self.available()
        if len(avail) < self.rng.min_nodes:
            out = {**self.sitting_out, **self.gone}
            why = "".join(f"; {host} out ({reason})" for host, reason in out.items())
            raise LaunchError(f"--nnodes {self.rng}: only {len(avail)} usable host(s) of {len(self.pool)}{why}",
                              f"give at least {self.rng.min_nodes} working hosts in the hostfile, or lower MIN")
        members = largest_valid(avail, self.rng, check)
        if members is None:
            raise LaunchError(self._no_world(avail, check), "change the config's batch sizes or the range")
        return members

    def available(self) -> list[NodeSlots]:
        return [n for n in self.pool if n.host.name not in self.sitting_out and n.host.name not in self.gone]

    def after_failure(self, members: tuple[NodeSlots, ...], failed: str | None, exit_code: int,
                      unhealthy: dict[str, str], check: WorldCheck) -> Change | None:
        """The next attempt's members after ``failed`` (a host name) failed; None: no valid world is left."""
        out: dict[str, str] = {}
        back = tuple(h for h in self.sitting_out if self.rejoin and h not in unhealthy)
        for host in back:
            del self.sitting_out[host]
        if failed is not None:
            key = (failed, exit_code)
            self.strikes[key] = self.strikes.get(key, 0) + 1
            if self.strikes[key] >= 2:
                self.gone[failed] = out[failed] = f"failed twice with exit status {exit_code}"
                self.sitting_out.pop(failed, None)
            else:
                self.sitting_out[failed] = out[failed] = "its rank failed"
        for host, why in unhealthy.items():
            if host not in self.gone:
                self.sitting_out[host] = out[host] = why
        avail = [n for n in self.pool if n.host.name not in self.sitting_out and n.host.name not in self.gone]
        chosen = largest_valid(avail, self.rng, check)
        if chosen is None and failed is not None and failed in self.sitting_out and failed not in unhealthy:
            del self.sitting_out[failed]  # the suspect again, rather than no run at all
            out.pop(failed)
            chosen = largest_valid([n for n in self.pool if n.host.name not in self.sitting_out
                                    and n.host.name not in self.gone], self.rng, check)
        if chosen is None:
            return None
        was = {n.host.name for n in members}
        return Change(chosen, out, tuple(n.host.name for n in chosen if n.host.name not in was))

    def _no_world(self, avail: list[NodeSlots], check: WorldCheck) -> str:
        tried = [(k, world_of(avail[:k])) for k in range(min(self.rng.max_nodes, len(avail)), self.rng.min_nodes - 1, -1)]
        why = "; ".join(f"{k} node(s) = world {w}: {check(w)}" for k, w in tried) or "too few hosts"
        return f"no valid world with --nnodes {self.rng} among {len(avail)} host(s): {why}"

    def no_world(self, check: WorldCheck) -> str:
        return self._no_world(self.available(), check)


def change_line(before: tuple[NodeSlots, ...], change: Change) -> str | None:
    """The one log line of a change of membership (None when the same nodes run again)."""
    now = change.members
    if [n.host.name for n in now] == [n.host.name for n in before]:
        return None
    parts = [f"{host} out ({why})" for host, why in change.out.items()]
    parts += [f"{host} in" for host in change.back]
    return (f"zerorun: membership: {len(before)} -> {len(now)} node(s), world {world_of(before)} -> "
            f"{world_of(now)}: {', '.join(parts) or 'spares in'}; now {', '.join(n.host.name for n in now)}")
