"""The tuning run: starting point -> baseline trial -> space -> coarse-to-fine -> best.yaml.

The first trial runs the starting config unchanged (the baseline). It tells the tuner
what it cannot read from the config: the model's hidden size (unless ``hidden_size``
was given), its parameter count (for the memory pruning) and how long one trial takes
(the default trial timeout is four times that, at least a minute). Every trial, pruned
candidates included, is appended to the ledger under the run key, so a rerun of the
same tuning replays what was recorded and runs only what is missing.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from zerorun.autotune.classify import Outcome, TrialOutcome
from zerorun.autotune.ledger import Ledger, TrialRecord, knob_key, run_key
from zerorun.autotune.protocol import apply_overrides
from zerorun.autotune.prune import MemoryContext, check
from zerorun.autotune.results import best_yaml, dry_run
from zerorun.autotune.runner import TrialRunner
from zerorun.autotune.search import (
    Deadline,
    Metric,
    SearchResult,
    SearchSpace,
    coarse_plan,
    coarse_to_fine,
    score_of,
)
from zerorun.autotune.space import SpaceError, build_space
from zerorun.autotune.start import StartPoint, memory_context

BASELINE_TIMEOUT_S = 900.0
"""The baseline's limit when --trial-timeout is not given (nothing is known about the script yet)."""
MIN_TRIAL_TIMEOUT_S = 60.0
TIMEOUT_FACTOR = 4.0


@dataclass(frozen=True)
class TuneOptions:
    """How to search (the launcher's own options live in the runner)."""

    out_dir: Path
    metric: Metric = "throughput"
    time_budget_s: float | None = None
    trial_timeout_s: float | None = None
    hidden_size: int | None = None
    params: int | None = None  # parameter count for pruning without a baseline (--dry-run)
    gpu_memory: int | None = None  # bytes per GPU; None: the local GPUs' (no pruning without one)
    knobs: tuple[str, ...] | None = None  # tune only these (default: every knob of the stage)
    factor: float = 4.0
    grid_points: int = 2  # coarse values on each side of the centre
    max_rounds: int = 6


class Progress(Protocol):
    """What the tuner reports while it runs (the CLI draws it; tests may record it)."""

    def started(self, index: int, planned: int, knobs: Mapping[str, Any], phase: str) -> None: ...

    def finished(self, index: int, record: TrialRecord, replayed: bool, best: TrialRecord | None) -> None: ...


class _Quiet:
    def started(self, index: int, planned: int, knobs: Mapping[str, Any], phase: str) -> None:
        pass

    def finished(self, index: int, record: TrialRecord, replayed: bool, best: TrialRecord | None) -> None:
        pass


@dataclass
class TuneReport:
    """The outcome of a tuning run."""

    result: SearchResult
    space: SearchSpace
    records: dict[str, TrialRecord] = field(default_factory=dict)  # knob_key -> ledger record
    ran: int = 0  # trials run now (not replayed from the ledger)
    replayed: int = 0
    best_path: Path | None = None
    wall_s: float = 0.0


def restrict(space: SearchSpace, knobs: tuple[str, ...] | None) -> SearchSpace:
    """``space`` tuning only ``knobs`` (the others stay at their starting values)."""
    if knobs is None:
        return space
    unknown = [k for k in knobs if k not in space.values]
    if unknown:
        raise SpaceError(f"--knobs {','.join(unknown)}: not tuned at stage {space.stage}",
                         hint=f"choose from {', '.join(space.values)}")
    return replace(space, values={k: v for k, v in space.values.items() if k in knobs})


class Tuner:
    """One tuning run of ``runner``'s script from ``start``."""

    def __init__(self, start: StartPoint, runner: TrialRunner, options: TuneOptions,
                 progress: Progress | None = None) -> None:
        self.start, self.runner, self.opts = start, runner, options
        self.progress: Progress = progress or _Quiet()
        self.key = run_key({"config": start.config, "fixed": start.fixed, "world_size": start.world_size,
                            "launcher": list(runner.launcher_args), "warmup": runner.warmup, "steps": runner.steps},
                           runner.script, runner.script_args)
        self.ledger = Ledger(options.out_dir / "ledger.jsonl")
        self.done = self.ledger.done(self.key)  # knob_key -> its latest record in this run
        self.records: dict[str, TrialRecord] = {}
        self.ctx: MemoryContext | None = None
        self.timeout_s = options.trial_timeout_s
        self.planned = 1
        self.ran = self.replayed = 0
        self.best: TrialRecord | None = None

    def space(self, hidden_size: int | None) -> SearchSpace:
        full = build_space(self.start.stage, self.start.knobs, hidden_size=hidden_size, factor=self.opts.factor,
                           each_side=self.opts.grid_points, micro_batches=self.start.micro_batches)
        return restrict(full, self.opts.knobs)

    def feasible(self, knobs: dict[str, Any]) -> str | None:
        """None when ``knobs`` may run; else why not (recorded once as a pruned trial)."""
        key = knob_key(knobs)
        ran = key in self.records and self.records[key].status is not Outcome.PRUNED
        if self.ctx is None or ran:
            return None  # a candidate that already ran (the baseline) is never pruned after the fact
        verdict = check(self.ctx, knobs)
        if verdict.fits:
            return None
        if key in self.records:
            return verdict.reason
        if key in self.done and self.done[key].status is Outcome.PRUNED:
            self._note(self.done[key], replayed=True)
        else:
            record = TrialRecord(self.key, dict(knobs), Outcome.PRUNED, predicted_bytes=verdict.predicted_bytes,
                                 reason=verdict.reason)
            self.ledger.append(record)
            self._note(record, replayed=False)
        return verdict.reason

    def trial(self, knobs: dict[str, Any], phase: str = "") -> TrialOutcome:
        """Run one candidate, or replay it from the ledger."""
        key = knob_key(knobs)
        if key in self.records:
            return self.records[key].outcome()
        index = len(self.records) + 1
        self.planned = max(self.planned, index)
        self.progress.started(index, self.planned, knobs, phase)
        if key in self.done and self.done[key].status is not Outcome.PRUNED:
            self.replayed += 1
            return self._note(self.done[key], replayed=True).outcome()
        trial_dir = self.opts.out_dir / "trials" / f"{self.key}-{index:03d}"
        timeout = self.timeout_s if self.timeout_s is not None else BASELINE_TIMEOUT_S
        run = self.runner.run(knobs, trial_dir, timeout)
        predicted = check(self.ctx, knobs).predicted_bytes if self.ctx is not None else None
        record = TrialRecord.from_outcome(self.key, knobs, run.outcome, predicted_bytes=predicted,
                                          duration_s=round(run.duration_s, 3), facts=run.facts)
        self.ledger.append(record)
        self.ran += 1
        return self._note(record, replayed=False).outcome()

    def _note(self, record: TrialRecord, replayed: bool) -> TrialRecord:
        self.records[knob_key(record.knobs)] = record
        score = score_of(record.outcome(), self.opts.metric)
        best = None if self.best is None else score_of(self.best.outcome(), self.opts.metric)
        if score is not None and (best is None or score > best):
            self.best = record
        self.progress.finished(len(self.records), record, replayed, self.best)
        return record

    def baseline(self) -> TrialRecord:
        """Run the starting config; learn the hidden size, the parameter count and the timeout."""
        start_knobs = self.space(None).start
        self.trial(dict(start_knobs), "baseline")
        record = self.records[knob_key(start_knobs)]
        if self.timeout_s is None:
            self.timeout_s = max(MIN_TRIAL_TIMEOUT_S, TIMEOUT_FACTOR * (record.duration_s or BASELINE_TIMEOUT_S))
        return record

    def run(self) -> TuneReport:
        began = time.monotonic()
        deadline = Deadline(self.opts.time_budget_s)
        base = self.baseline()
        hidden = self.opts.hidden_size or base.facts.get("hidden_size")
        params = self.opts.params or base.facts.get("num_parameters")
        self.ctx = memory_context(self.start, params, self.opts.gpu_memory or _local_gpu_memory())
        space = self.space(hidden)
        self.planned = max(self.planned, len(coarse_plan(space)))
        result = coarse_to_fine(space, self.trial_for_search, metric=self.opts.metric, feasible=self.feasible,
                                out_of_time=deadline.expired, max_rounds=self.opts.max_rounds)
        report = TuneReport(result, space, self.records, self.ran, self.replayed, wall_s=time.monotonic() - began)
        report.best_path = self.write_best(result)
        return report

    def trial_for_search(self, knobs: dict[str, Any]) -> TrialOutcome:
        return self.trial(knobs, "search")

    def write_best(self, result: SearchResult) -> Path:
        path = self.opts.out_dir / "best.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(best_yaml(apply_overrides(self.start.config, self.start.fixed), result, self.opts.metric))
        return path

    def plan(self) -> tuple[SearchSpace, list[tuple[dict[str, Any], str | None]], str | None]:
        """``--dry-run``: round 1's candidates, each pruned or not, and why pruning is off if it is."""
        space = self.space(self.opts.hidden_size)
        gpu = self.opts.gpu_memory or _local_gpu_memory()
        self.ctx = memory_context(self.start, self.opts.params, gpu)
        why_off = None
        if self.ctx is None:
            why_off = "no memory pruning: " + (
                "no GPU memory known (pass --gpu-memory)" if not gpu
                else "the parameter count is learned from the baseline trial (pass --params to prune here)")
        return space, dry_run(space, self.verdict), why_off

    def verdict(self, knobs: dict[str, Any]) -> str | None:
        """Why ``knobs`` would be pruned, without recording anything (None: it would run)."""
        if self.ctx is None:
            return None
        verdict = check(self.ctx, knobs)
        return None if verdict.fits else verdict.reason


def _local_gpu_memory() -> int | None:
    from zerorun.estimate.gpu import local_gpus

    return local_gpus()[1]
