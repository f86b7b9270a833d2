"""Coarse-to-fine search over a space, pure over a "run one trial" callable.

Round 1 changes one knob at a time over its whole coarse grid, always around the best
configuration so far. Each later round refines: for every size knob, the geometric
midpoints between the best value and its tried neighbours; on/off knobs are retried
against the new best. The search stops when a round improves the best score by less
than ``min_gain`` (2%), when the time budget runs out, or when nothing is left to try.
Candidates the ``feasible`` check rejects (the memory estimate) are recorded as pruned
and never run.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal

from zerorun.autotune.classify import Outcome, TrialOutcome
from zerorun.autotune.ledger import knob_key
from zerorun.autotune.space import BOOL_KNOBS, EVEN_KNOBS, MICRO_BATCH, SearchSpace, refine, with_value
from zerorun.errors import ZerorunError

Metric = Literal["throughput", "memory"]
RunTrial = Callable[[dict[str, Any]], TrialOutcome]
RunBatch = Callable[[list[dict[str, Any]]], list[TrialOutcome]]  # several candidates, measured interleaved
Feasible = Callable[[dict[str, Any]], str | None]  # None: may run; else why it was pruned


class StopReason(str, Enum):
    CONVERGED = "converged"  # the last round improved less than min_gain
    BUDGET = "time budget"  # out of time
    EXHAUSTED = "exhausted"  # no untried candidate left
    NOTHING_RAN = "nothing ran"  # every candidate failed or was pruned


@dataclass(frozen=True)
class Evaluated:
    """A candidate and what became of it (``outcome`` is a PRUNED outcome when it never ran)."""

    knobs: dict[str, Any]
    outcome: TrialOutcome
    score: float | None  # higher is better; None when it did not finish
    phase: str  # "start", "coarse" or "refine N"


@dataclass
class SearchResult:
    start: Evaluated
    best: Evaluated | None
    trials: list[Evaluated] = field(default_factory=list)
    stop: StopReason = StopReason.EXHAUSTED
    rounds: int = 0

    def gain_over_start(self) -> float | None:
        """best/start - 1 (e.g. 0.12 = 12% better), None when either did not finish."""
        if self.best is None or self.best.score is None or self.start.score is None or self.start.score == 0:
            return None
        return self.best.score / self.start.score - 1 if self.start.score > 0 else self.start.score / self.best.score - 1


def score_of(outcome: TrialOutcome, metric: Metric) -> float | None:
    """Throughput: samples per second (or 1/step time); memory: minus the peak bytes."""
    if outcome.status is not Outcome.FINISHED:
        return None
    if metric == "memory":
        return None if outcome.peak_bytes is None else -float(outcome.peak_bytes)
    if outcome.samples_per_s is not None:
        return float(outcome.samples_per_s)
    return None if not outcome.median_step_s else 1.0 / outcome.median_step_s


def parse_duration(text: str) -> float:
    """``90s``, ``10m``, ``1.5h``, or bare seconds -> seconds."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([smh]?)\s*", text)
    if match is None:
        raise ZerorunError(f"cannot read the duration {text!r}", hint="write it like 90s, 10m or 1.5h")
    return float(match.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[match.group(2)]


class Deadline:
    """``expired()`` once ``seconds`` have passed since construction."""

    def __init__(self, seconds: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._end = None if seconds is None else clock() + seconds

    def expired(self) -> bool:
        return self._end is not None and self._clock() >= self._end


class _Search:
    def __init__(self, space: SearchSpace, run: RunTrial, metric: Metric, feasible: Feasible | None,
                 run_batch: RunBatch | None = None) -> None:
        self.space, self.run, self.metric, self.feasible = space, run, metric, feasible
        self.run_batch: RunBatch = run_batch or (lambda batch: [run(knobs) for knobs in batch])
        self.seen: dict[str, Evaluated] = {}
        self.trials: list[Evaluated] = []
        self.tried: dict[str, set[Any]] = {k: set() for k in space.knobs}
        self.best: Evaluated | None = None

    def evaluate(self, knobs: dict[str, Any], phase: str) -> Evaluated:
        return self.evaluate_all([knobs], phase)[0]

    def evaluate_all(self, batch: list[dict[str, Any]], phase: str) -> list[Evaluated]:
        """Evaluate a batch of candidates; the feasible new ones are measured together."""
        fresh = list({knob_key(k): k for k in batch if knob_key(k) not in self.seen}.values())
        pruned = {knob_key(k): r for k in fresh if (r := self.feasible(k) if self.feasible else None) is not None}
        runnable = [k for k in fresh if knob_key(k) not in pruned]
        outcomes = dict(zip([knob_key(k) for k in runnable], self.run_batch(runnable), strict=True))
        for knobs in fresh:
            key = knob_key(knobs)
            if key in pruned:
                self._record(Evaluated(knobs, TrialOutcome(Outcome.PRUNED, reason=pruned[key]), None, phase))
            else:
                self._record(Evaluated(knobs, outcomes[key], score_of(outcomes[key], self.metric), phase))
        return [self.seen[knob_key(k)] for k in batch]

    def _record(self, ev: Evaluated) -> None:
        knobs = ev.knobs
        self.seen[knob_key(knobs)] = ev
        self.trials.append(ev)
        for k in self.tried:
            if k in knobs:
                self.tried[k].add(knobs[k])
        if ev.score is not None and (self.best is None or self.best.score is None or ev.score > self.best.score):
            self.best = ev

    def round_values(self, round_index: int) -> dict[str, list[Any]]:
        if round_index == 0:
            return {k: list(v) for k, v in self.space.values.items()}
        assert self.best is not None
        out: dict[str, list[Any]] = {}
        for knob in self.space.knobs:
            if knob in BOOL_KNOBS:
                out[knob] = list(self.space.values[knob])
            elif knob != MICRO_BATCH:
                out[knob] = refine(sorted(self.tried[knob]), self.best.knobs[knob], even=knob in EVEN_KNOBS)
        return out


def coarse_to_fine(
    space: SearchSpace,
    run: RunTrial,
    *,
    metric: Metric = "throughput",
    feasible: Feasible | None = None,
    out_of_time: Callable[[], bool] = lambda: False,
    min_gain: float = 0.02,
    max_rounds: int = 6,
    run_batch: RunBatch | None = None,
) -> SearchResult:
    """Search ``space`` from its start; ``run`` runs one candidate and is called once per
    distinct candidate that passes ``feasible``. With ``run_batch``, the values of one
    knob are measured together (interleaved repeats) around the best so far."""
    s = _Search(space, run, metric, feasible, run_batch)
    result = SearchResult(start=s.evaluate(dict(space.start), "start"), best=None)
    for round_index in range(max_rounds):
        before = s.best.score if s.best else None
        phase = "coarse" if round_index == 0 else f"refine {round_index}"
        values = s.round_values(round_index) if s.best or round_index == 0 else {}
        fresh = 0
        for knob, choices in values.items():
            if out_of_time():
                return _finish(result, s, StopReason.BUDGET, round_index + 1)  # the round it stopped in counts
            base = s.best.knobs if s.best else space.start
            batch = [with_value(base, knob, value) for value in choices]
            fresh += len({knob_key(c) for c in batch} - s.seen.keys())
            s.evaluate_all(batch, phase)
        if s.best is None:
            return _finish(result, s, StopReason.NOTHING_RAN, round_index + 1)
        if fresh == 0:
            return _finish(result, s, StopReason.EXHAUSTED, round_index + 1)
        if before is not None and s.best.score - before < min_gain * abs(before):
            return _finish(result, s, StopReason.CONVERGED, round_index + 1)
    return _finish(result, s, StopReason.EXHAUSTED, max_rounds)


def _finish(result: SearchResult, s: _Search, stop: StopReason, rounds: int) -> SearchResult:
    result.best, result.trials, result.stop, result.rounds = s.best, s.trials, stop, rounds
    return result


def coarse_plan(space: SearchSpace) -> list[dict[str, Any]]:
    """What round 1 would try if the start stayed best: for ``--dry-run``."""
    plan, keys = [dict(space.start)], {knob_key(space.start)}
    for knob, choices in space.values.items():
        for value in choices:
            candidate = with_value(space.start, knob, value)
            if knob_key(candidate) not in keys:
                keys.add(knob_key(candidate))
                plan.append(candidate)
    return plan


def describe(knobs: Mapping[str, Any], start: Mapping[str, Any]) -> str:
    """The knobs that differ from the start, e.g. ``reduce_bucket_size=2.5e+07 overlap_comm=True``."""
    diffs = [f"{k}={v:.3g}" if isinstance(v, int) and not isinstance(v, bool) and v >= 10_000 else f"{k}={v}"
             for k, v in knobs.items() if start.get(k) != v]
    return " ".join(diffs) or "(start)"
