"""What ``zerorun autotune`` draws: live progress, the ranked table, the dry-run plan.

Only the CLI imports this module (rich stays out of the library). Progress goes to
stderr, the final table to stdout.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import TracebackType
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from zerorun.autotune.classify import Outcome
from zerorun.autotune.ledger import TrialRecord, knob_key
from zerorun.autotune.results import ranked
from zerorun.autotune.search import Metric, SearchSpace, describe
from zerorun.autotune.tuner import TuneReport

_STYLE = {Outcome.FINISHED: "green", Outcome.PRUNED: "dim", Outcome.OOM: "red", Outcome.TIMEOUT: "yellow",
          Outcome.CRASH: "red"}


def _size(value: int | None) -> str:
    if value is None:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value} B"


def _rate(record: TrialRecord) -> str:
    return f"{record.samples_per_s:.2f}" if record.samples_per_s is not None else "-"


class LiveProgress:
    """The tuner's ``Progress``: one line per trial, and a live footer with the best so far."""

    def __init__(self, start: Mapping[str, Any], console: Console | None = None) -> None:
        self.start = dict(start)
        self.console = console or Console(stderr=True, highlight=False)
        self.current = Text("starting the baseline trial")
        self.best_line = Text("best so far: -")
        self.live = Live(Group(self.current, self.best_line), console=self.console, transient=True,
                         refresh_per_second=4)

    def __enter__(self) -> LiveProgress:
        self.live.__enter__()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.live.__exit__(kind, exc, tb)

    def started(self, index: int, planned: int, knobs: Mapping[str, Any], phase: str) -> None:
        self.current.plain = f"trial {index} of {planned}+ ({phase}): {describe(knobs, self.start)} ..."

    def finished(self, index: int, record: TrialRecord, replayed: bool, best: TrialRecord | None) -> None:
        status = record.status
        what = f"{_rate(record)} samples/s, peak {_size(record.peak_bytes)}" if status is Outcome.FINISHED else (
            escape(record.reason))
        source = " (from the ledger)" if replayed else f" in {record.duration_s:.1f}s" if record.duration_s else ""
        self.console.print(f"[{_STYLE[status]}]{status.value:>8}[/] trial {index}: "
                           f"{escape(describe(record.knobs, self.start))} -> {what}{source}")
        if best is not None:
            self.best_line.plain = f"best so far: {_rate(best)} samples/s with {describe(best.knobs, self.start)}"


def results_table(report: TuneReport, metric: Metric) -> Table:
    """Every trial: finished best first, then failures with their reason, then pruned."""
    start = report.result.start.knobs
    table = Table(title=f"zerorun autotune: {len(report.result.trials)} candidates, metric {metric}")
    for name in ("#", "knobs (vs start)", "samples/s", "spread", "median step", "peak memory", "status", "why"):
        right = name in ("#", "samples/s", "spread", "median step", "peak memory")
        table.add_column(name, justify="right" if right else "left", overflow="fold",
                         min_width=24 if name.startswith("knobs") else None)
    for i, ev in enumerate(ranked(report.result), 1):
        o = ev.outcome
        record = report.records.get(knob_key(ev.knobs))
        reason = o.reason or ("winner" if report.result.best is ev else "")
        table.add_row(
            str(i), escape(describe(ev.knobs, start)),
            f"{o.samples_per_s:.2f}" if o.samples_per_s is not None else "-",
            f"{o.spread:.1%}" if o.spread is not None else "-",
            f"{o.median_step_s * 1000:.1f} ms" if o.median_step_s is not None else "-",
            _size(o.peak_bytes if o.peak_bytes is not None else (record.predicted_bytes if record else None)),
            f"[{_STYLE[o.status]}]{o.status.value}[/]", escape(reason[:120]),
        )
    return table


def dry_run_table(space: SearchSpace, plan: list[tuple[dict[str, Any], str | None]], note: str | None) -> Table:
    """Round 1's candidates and, for each, ``would run`` or why it is pruned."""
    table = Table(title=f"zerorun autotune --dry-run: stage {space.stage}, {len(plan)} round-1 candidates "
                        f"(later rounds refine around the best)", caption=note)
    table.add_column("#", justify="right")
    table.add_column("knobs (vs start)")
    table.add_column("verdict")
    for i, (knobs, reason) in enumerate(plan, 1):
        verdict = "[green]would run[/]" if reason is None else f"[dim]pruned: {escape(reason)}[/]"
        table.add_row(str(i), escape(describe(knobs, space.start)), verdict)
    return table


def space_lines(space: SearchSpace) -> list[str]:
    """One line per tuned knob: its start and its coarse values."""
    return [f"{k}: start {space.start.get(k)!r}, values {list(v)}" for k, v in space.values.items()]


def report_json(report: TuneReport, metric: Metric) -> dict[str, Any]:
    """The tuning run as data (``--json``): every candidate ranked, the winner, where best.yaml is."""
    result = report.result

    def entry(ev: Any) -> dict[str, Any]:
        o = ev.outcome
        return {"knobs": ev.knobs, "phase": ev.phase, "status": o.status.value, "samples_per_s": o.samples_per_s,
                "median_step_s": o.median_step_s, "peak_bytes": o.peak_bytes, "spread": o.spread,
                "score": ev.score, "reason": o.reason}

    return {
        "metric": metric, "stage": report.space.stage, "stop": result.stop.value, "rounds": result.rounds,
        "ran": report.ran, "replayed": report.replayed, "wall_s": round(report.wall_s, 3),
        "gain_over_start": result.gain_over_start(), "best_config": str(report.best_path) if report.best_path else None,
        "start": entry(result.start), "best": entry(result.best) if result.best is not None else None,
        "trials": [entry(ev) for ev in ranked(result)],
    }


def dry_run_json(space: SearchSpace, plan: list[tuple[dict[str, Any], str | None]], note: str | None) -> dict[str, Any]:
    """``--dry-run --json``: the space and round 1's candidates with their verdicts."""
    return {"stage": space.stage, "start": space.start, "values": {k: list(v) for k, v in space.values.items()},
            "candidates": [{"knobs": k, "pruned": r} for k, r in plan], "note": note}
