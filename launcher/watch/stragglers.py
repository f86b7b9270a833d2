"""Stragglers: a rank whose own work per step stays above ``factor`` x the median rank's for
``steps`` steps in a row.

In data parallelism every rank's step takes the same wall time: the fast ranks wait for
the slow one in the next collective. So a step's cost is split: the time a rank spent
blocked in collectives (the engine measures it) is waiting, the rest is its own work
("busy"). The straggler is the rank whose busy time is out of line; its peers' is not,
however long their steps get.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field

DEFAULT_FACTOR = 2.0
DEFAULT_STEPS = 5
MIN_EXCESS_S = 0.02
"""Busy time above the median by less than this is noise, whatever the ratio (millisecond steps)."""
KEEP_STEPS = 64


@dataclass
class Straggler:
    rank: int
    host: str
    ratio: float
    busy_s: float
    median_s: float
    steps: int
    """Steps in a row over the line (so far)."""


@dataclass
class StragglerTracker:
    """Fed each rank's ``(step, seconds, seconds waiting)`` records; names stragglers as steps complete."""

    world_size: int
    factor: float = DEFAULT_FACTOR
    steps: int = DEFAULT_STEPS
    _busy: dict[int, dict[int, float]] = field(default_factory=dict)
    _run: dict[int, int] = field(default_factory=dict)
    flagged: dict[int, Straggler] = field(default_factory=dict)
    """Every rank ever flagged, with its worst run."""
    hosts: dict[int, str] = field(default_factory=dict)

    def add(self, rank: int, host: str, records: list[tuple[int, float, float]]) -> list[Straggler]:
        """Take records; return the ranks newly flagged by the steps that became complete."""
        self.hosts[rank] = host
        new = []
        for step, seconds, waiting in records:
            per_rank = self._busy.setdefault(step, {})
            per_rank[rank] = max(0.0, seconds - waiting)
            if len(per_rank) == self.world_size:
                new += self._judge(self._busy.pop(step))
        for old in [s for s in self._busy if s < max(self._busy, default=0) - KEEP_STEPS]:
            del self._busy[old]  # a step some rank never reported (it exited): forget it
        return new

    def _judge(self, busy: dict[int, float]) -> list[Straggler]:
        median = statistics.median(busy.values())
        new = []
        for rank, b in busy.items():
            if b > self.factor * median and b - median > MIN_EXCESS_S:
                self._run[rank] = self._run.get(rank, 0) + 1
                if self._run[rank] >= self.steps:
                    was = self.flagged.get(rank)
                    ratio = b / median if median > 0 else float("inf")
                    s = Straggler(rank, self.hosts.get(rank, "?"), ratio, b, median, self._run[rank])
                    if was is None:
                        new.append(s)
                    if was is None or s.steps >= was.steps:
                        self.flagged[rank] = s
            else:
                self._run[rank] = 0
        return new

    def current(self) -> list[int]:
        """Ranks over the line right now."""
        return sorted(r for r, n in self._run.items() if n >= self.steps)


def describe(s: Straggler) -> str:
    ratio = f"{s.ratio:.1f}x" if s.ratio != float("inf") else "far above"
    return (f"rank {s.rank} ({s.host}) is a straggler: {s.busy_s:.3f} s of its own work per step, {ratio} the "
            f"median rank's {s.median_s:.3f} s, for {s.steps} steps in a row")
