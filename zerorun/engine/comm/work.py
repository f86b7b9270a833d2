"""Collectives in flight: one :class:`Work` protocol for torch's works, point-to-point exchanges,
the shared-memory lane's collectives and the checking mode's deferred works; :class:`Pending` is
the handle every collective returns."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

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

    def then(self, fn: Callable[[], None]) -> Pending:
        """Run ``fn`` once the collective has completed (at ``wait()``)."""
        self._then = fn
        return self

    def wait(self) -> None:
        if self.done:
            return
        if self._work is not None:
            self._work.wait()
        self.done = True
        if self._then is not None:
            self._then()


class Exchange:
    """The point-to-point works of one emulated collective; ``finish`` runs once all completed."""

    def __init__(self, works: list[Work], finish: Callable[[], None] | None = None) -> None:
        self.works = works
        self.finish = finish

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

    def wait(self) -> None:
        self.lane.complete_through(self.seq)
