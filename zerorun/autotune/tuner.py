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
from zerorun.autotune.space import IGNORED_BY_ENGINE, SpaceError, build_space
from zerorun.autotune.start import StartPoint, memory_context
from zerorun.errors import ZerorunError
from zerorun.trial.protocol import apply_overrides

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
    repeats: int = 2  # measurements of each candidate, interleaved with its siblings'


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
    ignored = [k for k in unknown if k in IGNORED_BY_ENGINE.get(space.stage, ())]
    if ignored:
        raise SpaceError(f"--knobs {','.join(ignored)}: the bundled engine does not read "
                         f"{'it' if len(ignored) == 1 else 'them'} at stage {space.stage}, so tuning would measure noise",
                         hint=f"choose from {', '.join(space.values)}")
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
        self.done_runs = self.ledger.done_repeats(self.key)  # (knob_key, repeat) -> its record
        self.planned = 1
        self.started = 0
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
        """Measure one candidate (``repeats`` times), or replay it from the ledger."""
        return self.trials([knobs], phase)[0]

    def trials(self, candidates: list[dict[str, Any]], phase: str = "") -> list[TrialOutcome]:
        """Measure ``candidates`` ``repeats`` times each, interleaved (A B C, A B C ...).

        Interleaving spreads a slow spell of a shared machine over every candidate
        instead of one; each candidate's score is the best of its repeats (noise only
        ever slows a run down) and its spread says how far apart they were. A
        candidate that fails once is not run again.
        """
        pending = [dict(c) for c in candidates if knob_key(c) not in self.records]
        pending = list({knob_key(c): c for c in pending}.values())
        runs: dict[str, list[TrialRecord]] = {knob_key(c): [] for c in pending}
        for repeat in range(self.opts.repeats):
            for knobs in pending:
                done = runs[knob_key(knobs)]
                if done and done[-1].status is not Outcome.FINISHED:
                    continue
                done.append(self._measure(knobs, phase, repeat))
        for knobs in pending:
            self._note(aggregate(runs[knob_key(knobs)]), replayed=False)
        return [self.records[knob_key(c)].outcome() for c in candidates]

    def _measure(self, knobs: dict[str, Any], phase: str, repeat: int) -> TrialRecord:
        """One run of one candidate (or its record from the ledger of an earlier run)."""
        self.planned = max(self.planned, self.started + 1)
        self.started += 1
        self.progress.started(self.started, self.planned, knobs, phase + (f" #{repeat + 1}" if repeat else ""))
        previous = self.done_runs.get((knob_key(knobs), repeat))
        if previous is not None and previous.status is not Outcome.PRUNED:
            self.replayed += 1
            return previous
        trial_dir = self.opts.out_dir / "trials" / f"{self.key}-{self.started:03d}"
        timeout = self.timeout_s if self.timeout_s is not None else BASELINE_TIMEOUT_S
        run = self.runner.run(knobs, trial_dir, timeout)
        predicted = check(self.ctx, knobs).predicted_bytes if self.ctx is not None else None
        record = TrialRecord.from_outcome(self.key, knobs, run.outcome, predicted_bytes=predicted,
                                          duration_s=round(run.duration_s, 3), facts=run.facts, repeat=repeat)
        if run.log_path is not None and not run.outcome.ok:
            record = replace(record, facts={**record.facts, "log": str(run.log_path)})
        self.ledger.append(record)
        self.ran += 1
        return record

    def _note(self, record: TrialRecord, replayed: bool) -> TrialRecord:
        self.records[knob_key(record.knobs)] = record
        score = score_of(record.outcome(), self.opts.metric)
        best = None if self.best is None else score_of(self.best.outcome(), self.opts.metric)
        if score is not None and (best is None or score > best):
            self.best = record
        self.progress.finished(len(self.records), record, replayed, self.best)
        return record

    def baseline(self) -> TrialRecord:
        """Run the starting config; learn the hidden size, the parameter count and the timeout.

        A baseline that does not finish stops the tuning with its cause: every other
        candidate is the same script, and would fail the same way.
        """
        start_knobs = self.space(None).start
        self.trial(dict(start_knobs), "baseline")
        record = self.records[knob_key(start_knobs)]
        if record.status is not Outcome.FINISHED:
            log = record.facts.get("log")
            raise BaselineFailed(
                f"the baseline trial (the starting config, unchanged) ended: {record.status.value}: "
                f"{record.reason or 'no reason recorded'}",
                hint=(f"its output is in {log}; " if log else "") + "run the script once without autotune "
                "(zerorun [launcher options] SCRIPT) and fix it first")
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
                                out_of_time=deadline.expired, max_rounds=self.opts.max_rounds,
                                run_batch=self.trials_for_search)
        report = TuneReport(result, space, self.records, self.ran, self.replayed, wall_s=time.monotonic() - began)
        report.best_path = self.write_best(result)
        return report

    def trial_for_search(self, knobs: dict[str, Any]) -> TrialOutcome:
        return self.trial(knobs, "search")

    def trials_for_search(self, candidates: list[dict[str, Any]]) -> list[TrialOutcome]:
        return self.trials(candidates, "search")

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


class BaselineFailed(ZerorunError):
    """The starting config itself did not run: nothing can be tuned."""


def aggregate(runs: list[TrialRecord]) -> TrialRecord:
    """One candidate's record from its repeats: the best throughput, the worst peak, the spread.

    Any failed repeat makes the candidate failed (with that repeat's cause).
    """
    failed = next((r for r in runs if r.status is not Outcome.FINISHED), None)
    if failed is not None:
        return failed
    best = max(runs, key=lambda r: r.samples_per_s or 0.0)
    rates = [r.samples_per_s for r in runs if r.samples_per_s]
    spread = (max(rates) - min(rates)) / max(rates) if len(rates) > 1 else None
    peaks = [r.peak_bytes for r in runs if r.peak_bytes is not None]
    return replace(best, peak_bytes=max(peaks) if peaks else None, spread=spread,
                   duration_s=max(r.duration_s for r in runs),  # one run's time: what a trial timeout bounds
                   reason=f"best of {len(runs)} runs" + (f", spread {spread:.1%}" if spread is not None else ""))


def _local_gpu_memory() -> int | None:
    from zerorun.estimate.gpu import local_gpus

    return local_gpus()[1]
