"""``zerorun estimate --measure "SCRIPT [ARGS]"``: run the script briefly and compare.

The script runs unchanged, for a few optimizer steps, through the same trial
mechanism ``autotune`` uses (one launcher run with the ``ZERORUN_TRIAL_*``
variables; the engine writes its figures and exits after the steps). Then the
estimate for the config the engine really ran is printed next to what the worse rank
held physically at its peak, and next to the engine's own bookkeeping, term by term.
"""

from __future__ import annotations

import json
import shlex
import tempfile
from pathlib import Path
from typing import Any

from zerorun.errors import ZerorunError

DEFAULT_TIMEOUT_S = 600.0
UNCOUNTED = ("in_flight", "transport")  # estimated terms the engine's bookkeeping has no figure for


def run_measurement(command: str, ranks: int, config: Path | None, steps: int,
                    timeout_s: float = DEFAULT_TIMEOUT_S) -> dict[str, Any]:
    """The engine's facts after ``steps`` optimizer steps of ``command`` on ``ranks`` local ranks."""
    from zerorun.autotune.runner import TrialRunner

    argv = shlex.split(command)
    if not argv:
        raise ZerorunError("--measure needs the script to run", hint='e.g. --measure "train.py --config ds.yaml"')
    if not Path(argv[0]).is_file():
        raise ZerorunError(f"--measure: the script {argv[0]!r} is not a file",
                           hint="give the training script first, then its arguments, in one quoted string")
    launcher = ["--num_gpus", str(ranks), "--master_port", "auto", *(["--config", str(config)] if config else [])]
    runner = TrialRunner(tuple(launcher), argv[0], tuple(argv[1:]), warmup=1, steps=steps)
    with tempfile.TemporaryDirectory(prefix="zerorun-measure-") as tmp:
        run = runner.run({}, Path(tmp), timeout_s)
        log = run.log_path.read_text(errors="replace").splitlines() if run.log_path else []
    if not run.outcome.ok or "memory_breakdown" not in run.facts:
        tail = next((line.strip() for line in reversed(log) if line.strip()), "")
        raise ZerorunError(f"--measure: the script did not run {steps + 1} steps under the engine "
                           f"({run.outcome.status.value}: {run.outcome.reason or tail})",
                           hint="run the script alone first; it must call engine.step() at least "
                                f"{steps + 1} times" + (f"; its last output: {tail}" if tail else ""))
    return run.facts


def print_measurement(facts: dict[str, Any], as_json: bool) -> None:
    """The estimate against the worse rank's physical peak, then the engine's bookkeeping per term (or JSON)."""
    from zerorun.estimate.counts import human_bytes
    from zerorun.estimate.measure import compare

    rows, physical, notes = compare(facts)
    if as_json:
        print(json.dumps({"measured": {k: facts[k] for k in ("stage", "world_size", "num_parameters", "dtype",
                                                              "optimizer")},
                          "physical": None if physical is None else physical.to_json(),
                          "terms": [r.to_json() for r in rows], "notes": notes}, indent=2))
        return
    from rich.console import Console
    from rich.table import Table

    def ratio(value: float | None) -> str:
        return "-" if value is None else f"{value:.3f}"

    table = Table(title=f"stage {facts['stage']}, {facts['world_size']} rank(s), {facts['num_parameters']:,} "
                        f"parameters, {facts['dtype']}, {facts['optimizer']}: bytes per rank")
    for name in ("term", "estimate", "physical", "ratio", "bookkeeping", "ratio "):
        table.add_column(name, justify="left" if name == "term" else "right", no_wrap=True)
    for r in rows:
        total = r.term == "total" and physical is not None
        table.add_row(r.term, human_bytes(r.estimated),
                      human_bytes(physical.peak) if total else "-",  # type: ignore[union-attr]
                      ratio(physical.ratio) if total else "-",  # type: ignore[union-attr]
                      "-" if r.term in UNCOUNTED else human_bytes(r.measured),
                      "-" if r.term in UNCOUNTED else ratio(r.ratio))
    console = Console(highlight=False)
    console.print(table)
    if physical is not None:
        console.print(f"physical: the peak of the worse rank (rank {physical.worst_rank}: {physical.kind}); "
                      "ratio = measured / estimate", markup=False)
    for note in notes:
        console.print(f"note: {note}", markup=False)
