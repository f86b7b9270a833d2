"""What the tuner hands back: the ranked trials, the dry-run plan, and ``best.yaml``.

``best.yaml`` is the starting config with the winning knobs merged in (so it validates
with ``zerorun validate`` wherever the starting config did), under a comment block that
says what won, by how much over the starting config, and how the search ended.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import yaml

from zerorun.autotune.classify import Outcome
from zerorun.autotune.search import Evaluated, Metric, SearchResult, SearchSpace, coarse_plan, describe
from zerorun.trial.protocol import apply_overrides

_ORDER = {Outcome.FINISHED: 0, Outcome.OOM: 1, Outcome.TIMEOUT: 2, Outcome.CRASH: 3, Outcome.PRUNED: 4}


def ranked(result: SearchResult) -> list[Evaluated]:
    """Finished trials best first, then failures (OOM, timeout, crash), then pruned."""
    return sorted(result.trials, key=lambda t: (_ORDER[t.outcome.status], -(t.score or 0.0)))


def dry_run(space: SearchSpace, feasible: Callable[[dict[str, Any]], str | None]) -> list[tuple[dict[str, Any], str | None]]:
    """Round 1's candidates, each with None (would run) or the reason it is pruned."""
    return [(knobs, feasible(knobs)) for knobs in coarse_plan(space)]


def _metric_line(ev: Evaluated, metric: Metric) -> str:
    o = ev.outcome
    if metric == "memory":
        return f"peak {o.peak_bytes / 2**30:.2f} GiB" if o.peak_bytes is not None else "peak unknown"
    parts = []
    if o.samples_per_s is not None:
        parts.append(f"{o.samples_per_s:.2f} samples/s")
    if o.median_step_s is not None:
        parts.append(f"median step {o.median_step_s * 1000:.1f} ms")
    return ", ".join(parts) or "no timing"


def explanation(result: SearchResult, metric: Metric) -> list[str]:
    """The lines of ``best.yaml``'s comment block."""
    best = result.best
    if best is None:
        return ["zerorun autotune: no candidate finished; this is the starting config unchanged."]
    lines = [
        f"zerorun autotune: best of {sum(t.outcome.status is not Outcome.PRUNED for t in result.trials)} trials "
        f"({sum(t.outcome.status is Outcome.PRUNED for t in result.trials)} pruned by the memory estimate), "
        f"metric {metric}, stopped: {result.stop.value} after {result.rounds} round(s).",
        f"winner: {describe(best.knobs, result.start.knobs)} -> {_metric_line(best, metric)}",
    ]
    gain = result.gain_over_start()
    if gain is not None:
        verb = "faster" if metric == "throughput" else "less memory"
        lines.append(f"starting config: {_metric_line(result.start, metric)}; the winner is {gain:+.1%} {verb}.")
    else:
        lines.append(f"starting config did not finish ({result.start.outcome.status.value}: {result.start.outcome.reason}).")
    return lines


def best_yaml(start_config: Mapping[str, Any], result: SearchResult, metric: Metric) -> str:
    """The text of ``best.yaml``: a comment block, then the merged config."""
    knobs = result.best.knobs if result.best is not None else {}
    config = apply_overrides(start_config, knobs)
    header = "".join(f"# {line}\n" for line in explanation(result, metric))
    return header + yaml.safe_dump(config, sort_keys=False)
