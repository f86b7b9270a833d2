"""Collectives in flight: one :class:`Work` protocol for torch's works, point-to-point exchanges,
the shared-memory lane's collectives and the checking mode's deferred works; :class:`Pending` is
the handle every collective returns."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

import torch.distributed as dist

from zerorun.engine.comm import trace
from zerorun.engine.comm.shm import SharedLane


class Work(Protocol):
    """What can be waited for: ``torch.distributed.Work`` and the engine's own works."""

    def wait(self) -> object: ...


class Pending:
    """An in-flight collective. ``wait()`` blocks, then runs the completion callback once."""

    def __init__(self, work: Work | None, then: Callable[[], None] | None = None) -> None:
        self._work = work
        self._then = then
        self.done = False
        self.record: trace.Record | None = None
        """The collective, for the heartbeat: marked completed at ``wait()``."""
        self.issued_at = 0.0

    def traced(self, record: trace.Record, issued_at: float) -> Pending:
        """Note ``record`` completed now if nothing is left in flight (a blocking collective, whose
        whole time since ``issued_at`` was spent blocked), else at ``wait()``."""
        if self._work is None or self.done:
            trace.blocked_since(issued_at)
            trace.complete(record, issued_at)
        else:
            self.record, self.issued_at = record, issued_at
        return self

    def then(self, fn: Callable[[], None]) -> Pending:
        """Run ``fn`` once the collective has completed (at ``wait()``), after what ran there already."""
        first = self._then
        self._then = fn if first is None else lambda: (first(), fn())
        return self

    def ready(self) -> bool:
        """Whether ``wait()`` would not block: the collective has finished (or the backend cannot
        say: then False), its completion perhaps still to run."""
        if self.done or self._work is None:
            return True
        finished = getattr(self._work, "is_completed", None)
        return finished is not None and bool(finished())

    def wait(self) -> None:
        if self.done:
            return
        if self._work is not None:
            start = time.perf_counter()
            self._work.wait()
            trace.blocked_since(start)
        self.done = True
        if self.record is not None:
            trace.complete(self.record, self.issued_at)
        if self._then is not None:
            self._then()


class Exchange:
    """The point-to-point works of one emulated collective; ``finish`` runs once all completed."""

    def __init__(self, works: list[dist.Work], finish: Callable[[], None] | None = None) -> None:
        self.works = works
        self.finish = finish

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self.works)

    def wait(self) -> None:
        for w in self.works:
            w.wait()
        if self.finish is not None:
            self.finish()


class LaneWork:
    """A shared-memory collective in flight: waiting completes it (and every earlier one)."""

    def __init__(self, lane: SharedLane, seq: int) -> None:
        self.lane = lane
        self.seq = seq

    def is_completed(self) -> bool:
        return self.lane.posted_by_all(self.seq)  # completing it reads this rank's slots only: no wait

    def wait(self) -> None:
        self.lane.complete_through(self.seq)
