"""What counts as a bad exit in the exit stress test (:mod:`exit_rounds`'s records): the checker.

A rank is bad when it hung (alive at its run's deadline), exited non-zero (a signal reads as its
negative number: an abort is -6), or printed "terminate called" (a C++ abort in its finalization, even
if something turned it into exit 0). A rank of a zerorun job on the group zerorun created must also
finalize with its main thread alone: the engine's exit path (``zerorun/engine/teardown.py``) joins
gloo's threads, the ones that abort a rank when they need the GIL while the interpreter finalizes.
A run that never reported (the rounds stopped after a hang) is bad too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from exit_rounds import WORLD, Run

ZERORUN_SYSTEMS = ("z1", "z2", "z3", "readme")


def _where(rec: Mapping[str, Any]) -> str:
    group = "script's group" if rec["user_group"] or rec["system"] == "ddp" else "zerorun's group"
    return f"run {rec['run']} ({rec['system']}, ending {rec['ending']}, {group}) rank {rec['rank']}"


def rank_failure(rec: Mapping[str, Any]) -> str | None:
    """Why one rank's exit is bad, or None."""
    after = " after its last step" if rec["finished"] else " before its last step"
    if rec["hung"]:
        hang = rec.get("hang") or {}
        return (f"{_where(rec)}: hung{after} (killed at the deadline); threads {hang.get('threads')}; "
                f"log tail: {rec['tail'][-12:]}")
    if rec["exit"] != 0:
        return f"{_where(rec)}: exit {rec['exit']}{after}; log tail: {rec['tail']}"
    if rec["terminate"]:
        return f"{_where(rec)}: printed 'terminate called'; log tail: {rec['tail']}"
    own = rec["system"] in ZERORUN_SYSTEMS and not rec["user_group"]
    if own and (rec["threads"] is None or len(rec["threads"]) != 1):
        return f"{_where(rec)}: threads alive when the interpreter finalized: {rec['threads']}"
    return None


def failures(records: Iterable[Mapping[str, Any]], runs: Iterable[Run]) -> list[str]:
    """Every bad rank of ``runs`` (each rank of each run must have a record), one line each."""
    by = {(r["run"], r["rank"]): r for r in records if "rank" in r}
    out = []
    for run in runs:
        for rank in range(WORLD):
            rec = by.get((run.index, rank))
            why = f"run {run.index} ({run.system}) rank {rank}: no record" if rec is None else rank_failure(rec)
            if why:
                out.append(why)
    return out
