"""The lifecycle of one rank, as its agent sees it, with checked transitions."""

from __future__ import annotations

from enum import Enum


class RankState(Enum):
    """Where a rank process is in its life."""

    STARTING = "starting"
    """Not spawned yet."""
    RUNNING = "running"
    """Spawned and not yet exited."""
    STOPPING = "stopping"
    """Asked to stop (SIGTERM or forwarded SIGINT) because of a failure, a request or the launcher's exit."""
    SUCCEEDED = "succeeded"
    """Exited with status 0 on its own."""
    FAILED = "failed"
    """Exited non-zero (or by a signal) on its own: a failure to report."""
    STOPPED = "stopped"
    """Exited after being asked to stop; not a root cause."""

    @property
    def done(self) -> bool:
        return self in (RankState.SUCCEEDED, RankState.FAILED, RankState.STOPPED)


_ALLOWED: dict[RankState, frozenset[RankState]] = {
    RankState.STARTING: frozenset({RankState.RUNNING, RankState.STOPPED}),
    RankState.RUNNING: frozenset({RankState.STOPPING, RankState.SUCCEEDED, RankState.FAILED}),
    RankState.STOPPING: frozenset({RankState.STOPPED}),
    RankState.SUCCEEDED: frozenset(),
    RankState.FAILED: frozenset(),
    RankState.STOPPED: frozenset(),
}


def transition(current: RankState, new: RankState) -> RankState:
    """Return ``new`` if the move from ``current`` is legal; an illegal move is a bug here."""
    if new not in _ALLOWED[current]:
        raise AssertionError(f"illegal rank state transition {current.name} -> {new.name}")
    return new


def exit_status(returncode: int) -> int:
    """A shell-style status: a death by signal N is 128+N, never 0."""
    return 128 - returncode if returncode < 0 else returncode
