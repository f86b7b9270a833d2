"""A trial's outcome from its exit code and the result files the engine wrote.

Never from stderr text: the engine records what it saw (``protocol.ResultStatus``), by
exception type, and the exit code and the tuner's own timer say the rest.
"""

from __future__ import annotations

import json
import signal
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from zerorun.trial.protocol import ResultStatus


class Outcome(str, Enum):
    """The lifecycle end of one candidate."""

    FINISHED = "finished"  # ran its steps; metrics recorded
    PRUNED = "pruned"  # never ran: the memory estimate says it cannot fit
    OOM = "oom"  # a rank ran out of memory
    TIMEOUT = "timeout"  # the tuner stopped it at the trial's time limit
    CRASH = "crash"  # anything else: an exception, a signal, no result


@dataclass(frozen=True)
class TrialOutcome:
    """What happened, the metrics when it finished, and why otherwise."""

    status: Outcome
    median_step_s: float | None = None
    samples_per_s: float | None = None
    peak_bytes: int | None = None
    reason: str = ""
    spread: float | None = None  # over repeats: (best - worst) / best throughput; None with one run
    repeats: int = 1

    @property
    def ok(self) -> bool:
        return self.status is Outcome.FINISHED


def _read(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def read_results(result_path: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """(rank 0's result, the failure records of any rank)."""
    failures = [
        data
        for p in sorted(result_path.parent.glob(f"{result_path.name}.rank*"))
        if (data := _read(p)) is not None
    ]
    return _read(result_path), failures


def _exit_reason(exit_code: int | None) -> str:
    if exit_code is None:
        return "no exit code"
    code = exit_code - 128 if exit_code > 128 else -exit_code
    if exit_code < 0 or exit_code > 128:
        try:
            return f"killed by {signal.Signals(code).name}"
        except ValueError:
            pass
    return f"exit code {exit_code}"


def classify(exit_code: int | None, result_path: Path, *, timed_out: bool = False) -> TrialOutcome:
    """Combine the tuner's view (exit code, timeout) with the engine's records."""
    result, failures = read_results(result_path)
    if timed_out:
        return TrialOutcome(Outcome.TIMEOUT, reason="stopped at the trial's time limit")
    oom = next((f for f in failures if f.get("status") == ResultStatus.OOM.value), None)
    if oom is not None:
        return TrialOutcome(Outcome.OOM, peak_bytes=oom.get("peak_bytes"), reason=f"rank {oom.get('rank')}: {oom.get('error')}")
    if failures:
        first = failures[0]
        return TrialOutcome(Outcome.CRASH, reason=f"rank {first.get('rank')}: {first.get('error')}")
    if result is not None and result.get("status") == ResultStatus.OK.value:
        if exit_code != 0:
            return TrialOutcome(Outcome.CRASH, reason=f"recorded a result, then ended with {_exit_reason(exit_code)}")
        return TrialOutcome(
            Outcome.FINISHED,
            median_step_s=result.get("median_step_s"),
            samples_per_s=result.get("samples_per_s"),
            peak_bytes=result.get("peak_bytes"),
        )
    if exit_code == 0:
        return TrialOutcome(
            Outcome.CRASH,
            reason="exited without a result: did the script run warm-up + trial steps through engine.step()?",
        )
    return TrialOutcome(Outcome.CRASH, reason=f"no result recorded; {_exit_reason(exit_code)}")
