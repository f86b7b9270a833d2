"""The lifecycle of a stage-3 parameter bucket: sharded -> in flight -> gathered -> sharded.

Every transition goes through :func:`check_transition`, so a bucket that is freed while
its all-gather is still running, or gathered twice, fails loudly instead of computing
with half-written weights.
"""

from __future__ import annotations

from enum import Enum

from zerorun.engine.errors import EngineError

# The attribute on a stage-3 parameter that names its bucket (set by the bucket, read by the surfaces).
BUCKET_ATTR = "zr_bucket"


class ParamState(Enum):
    SHARDED = "sharded"  # only this rank's chunk is held; the parameters point at empty placeholders
    IN_FLIGHT = "in flight"  # the all-gather into the full buffer was issued and not yet waited for
    GATHERED = "gathered"  # the full buffer holds every rank's chunk; the parameters are views of it


_ALLOWED = {
    (ParamState.SHARDED, ParamState.IN_FLIGHT),
    (ParamState.IN_FLIGHT, ParamState.GATHERED),
    (ParamState.GATHERED, ParamState.SHARDED),
}


class ParamStateError(EngineError):
    """A stage-3 bucket was asked for a transition its lifecycle does not allow (an engine bug)."""


def check_transition(current: ParamState, new: ParamState, what: str) -> None:
    if (current, new) not in _ALLOWED:
        raise ParamStateError(f"{what}: cannot go from {current.value} to {new.value}",
                              "this is an engine bug; please report it with the model and config")
