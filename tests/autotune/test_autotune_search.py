"""Coarse-to-fine search against a fake cost function (no processes: the search is pure)."""

from __future__ import annotations

import math
from typing import Any

from zerorun.autotune.classify import Outcome, TrialOutcome
from zerorun.autotune.ledger import knob_key
from zerorun.autotune.search import (
    Deadline,
    StopReason,
    coarse_plan,
    coarse_to_fine,
    describe,
    parse_duration,
    score_of,
)
from zerorun.autotune.space import build_space, with_value

OPTIMUM = 3 * 10**7


class FakeCluster:
    """Throughput peaks at reduce_bucket_size = OPTIMUM, +5% with overlap; OOM above 1e9."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []

    def __call__(self, knobs: dict[str, Any]) -> TrialOutcome:
        self.calls.append(knobs)
        bucket = knobs["reduce_bucket_size"]
        if bucket > 10**9:
            return TrialOutcome(Outcome.OOM, reason="fake OOM")
        distance = math.log10(bucket) - math.log10(OPTIMUM)
        speed = 100 * math.exp(-(distance**2)) * (1.05 if knobs["overlap_comm"] else 1.0)
        return TrialOutcome(Outcome.FINISHED, median_step_s=1 / speed, samples_per_s=speed, peak_bytes=bucket)


def test_finds_the_optimum_and_runs_each_candidate_once() -> None:
    space = build_space(2, {"reduce_bucket_size": 5 * 10**8, "overlap_comm": False}, hidden_size=4096)
    fake = FakeCluster()
    result = coarse_to_fine(space, fake)
    assert result.best is not None and result.best.knobs["overlap_comm"] is True
    assert abs(math.log10(result.best.knobs["reduce_bucket_size"]) - math.log10(OPTIMUM)) < 0.2
    assert len({knob_key(k) for k in fake.calls}) == len(fake.calls)  # no candidate twice
    assert result.stop in (StopReason.CONVERGED, StopReason.EXHAUSTED)
    assert result.gain_over_start() is not None and result.gain_over_start() > 0.5
    assert any(t.phase.startswith("refine") for t in result.trials)


def test_stops_when_a_round_gains_less_than_two_percent() -> None:
    space = build_space(2, {"reduce_bucket_size": OPTIMUM, "overlap_comm": True, "contiguous_gradients": True})
    result = coarse_to_fine(space, FakeCluster())
    assert result.stop is StopReason.CONVERGED and result.rounds == 1
    assert result.best is not None and result.best.knobs == result.start.knobs


def test_pruned_candidates_never_run() -> None:
    space = build_space(2, {"reduce_bucket_size": 5 * 10**8}, hidden_size=4096)
    fake = FakeCluster()
    result = coarse_to_fine(space, fake, feasible=lambda k: "too big" if k["reduce_bucket_size"] > 5 * 10**7 else None)
    assert all(c["reduce_bucket_size"] <= 5 * 10**7 for c in fake.calls)
    pruned = [t for t in result.trials if t.outcome.status is Outcome.PRUNED]
    assert pruned and all(t.outcome.reason == "too big" for t in pruned)
    assert result.start.outcome.status is Outcome.PRUNED and result.best is not None


def test_time_budget_stops_the_search() -> None:
    space = build_space(2, {}, hidden_size=1024)
    fake = FakeCluster()
    budget = iter([False] + [True] * 100)
    result = coarse_to_fine(space, fake, out_of_time=lambda: next(budget))
    assert result.stop is StopReason.BUDGET
    first = next(iter(space.values))  # the budget is checked before each knob's batch of values
    batch = {knob_key(with_value(space.start, first, v)) for v in space.values[first]} - {knob_key(space.start)}
    assert len(fake.calls) == 1 + len(batch)  # the start, then the first knob's values before time ran out
    assert result.rounds == 1  # stopped inside round 1, which counts


def test_everything_failing_is_reported() -> None:
    space = build_space(2, {"reduce_bucket_size": 4 * 10**9}, factor=1.5, each_side=1)
    result = coarse_to_fine(space, FakeCluster())
    assert result.best is None and result.stop is StopReason.NOTHING_RAN
    assert all(t.outcome.status is Outcome.OOM for t in result.trials)


def test_memory_metric_minimises_peak_bytes() -> None:
    space = build_space(2, {"reduce_bucket_size": 10**8})
    result = coarse_to_fine(space, FakeCluster(), metric="memory")
    assert result.best is not None and result.best.knobs["reduce_bucket_size"] == min(space.values["reduce_bucket_size"])


def test_dry_run_plan_scores_and_helpers() -> None:
    space = build_space(2, {"reduce_bucket_size": 1000, "overlap_comm": False})
    plan = coarse_plan(space)
    assert plan[0] == space.start and len(plan) == len({knob_key(p) for p in plan})
    assert len(plan) == 1 + 4 + 1  # start, 4 other sizes of the bucket, the other value of overlap_comm
    assert score_of(TrialOutcome(Outcome.OOM), "throughput") is None
    assert score_of(TrialOutcome(Outcome.FINISHED, median_step_s=0.5), "throughput") == 2.0
    assert parse_duration("10m") == 600 and parse_duration("1.5h") == 5400 and parse_duration("30") == 30
    ticks = iter([0.0, 5.0, 11.0])
    deadline = Deadline(10, clock=lambda: next(ticks))
    assert not deadline.expired() and deadline.expired()
    assert describe({"reduce_bucket_size": 25_000_000, "overlap_comm": True}, {"reduce_bucket_size": 1, "overlap_comm": True}) == "reduce_bucket_size=2.5e+07"
