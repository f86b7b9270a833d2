"""`zerorun autotune`: bucket and prefetch sizes chosen by short real trials."""

from __future__ import annotations

import json
import signal
from types import FrameType

import typer

from zerorun.autotune.args import AutotuneArgs, durations, parse_autotune_args
from zerorun.autotune.display import (
    LiveProgress,
    dry_run_json,
    dry_run_table,
    report_json,
    results_table,
    space_lines,
)
from zerorun.autotune.runner import TrialRunner
from zerorun.autotune.start import load_start
from zerorun.autotune.tuner import TuneOptions, Tuner
from zerorun.commands.console import console


def _world_size(args: AutotuneArgs) -> int:
    from launcher.main import resolve_nodes

    nodes, _ = resolve_nodes(args.ns)
    return sum(len(n.slots) for n in nodes)


def _options(args: AutotuneArgs) -> TuneOptions:
    from pathlib import Path

    from zerorun.estimate import parse_gpu_memory, parse_param_count

    ns = args.ns
    budget, timeout = durations(ns)
    return TuneOptions(
        out_dir=Path(ns.out), metric=ns.metric, time_budget_s=budget, trial_timeout_s=timeout,
        hidden_size=ns.hidden_size, params=parse_param_count(ns.params) if ns.params else None,
        gpu_memory=parse_gpu_memory(ns.gpu_memory) if ns.gpu_memory else None,
        knobs=tuple(k.strip() for k in ns.knobs.split(",") if k.strip()) if ns.knobs else None,
        grid_points=ns.grid_points, max_rounds=ns.rounds, repeats=ns.repeats,
    )


def build_tuner(argv: list[str]) -> tuple[Tuner, AutotuneArgs]:
    """Everything checked before any trial runs: options, world size, config, space."""
    args = parse_autotune_args(argv)
    ns = args.ns
    start = load_start(ns.config, world_size=_world_size(args), stage=ns.stage, hidden_size=ns.hidden_size,
                       tune_micro_batch=ns.tune_micro_batch)
    runner = TrialRunner(args.launcher_args, args.script, args.script_args, warmup=ns.warmup_steps,
                         steps=ns.trial_steps, fixed=start.fixed)
    tuner = Tuner(start, runner, _options(args))
    tuner.space(ns.hidden_size)  # a bad --knobs fails here, before the baseline runs
    return tuner, args


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)  # unwinds through the runner, which stops the running trial


def command(ctx: typer.Context) -> None:
    """Tune ZeRO bucket and prefetch sizes by short real trials (`zerorun autotune -h` lists every option).

    Examples:

      zerorun autotune --num_gpus 2 --config ds.yaml train.py

      zerorun autotune --num_gpus 2 --config ds.yaml --dry-run --json --params 1.3B --gpu-memory 24 train.py
    """
    tuner, args = build_tuner(list(ctx.args))
    out, err = console(), console(stderr=True)  # 100 columns off a terminal: no column cut at 80
    if args.ns.dry_run:
        space, plan, note = tuner.plan()
        if args.ns.json:
            print(json.dumps(dry_run_json(space, plan, note), indent=2, default=str))
            return
        for line in space_lines(space):
            err.print(line, markup=False)
        out.print(dry_run_table(space, plan, note))
        return
    err.print(f"zerorun autotune: stage {tuner.start.stage}, {tuner.start.world_size} ranks, "
              f"ledger {tuner.ledger.path}", markup=False)
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    with LiveProgress(tuner.start.knobs, err) as progress:
        tuner.progress = progress
        report = tuner.run()
    if args.ns.json:
        print(json.dumps(report_json(report, tuner.opts.metric), indent=2, default=str))
        return
    out.print(results_table(report, tuner.opts.metric))
    gain = report.result.gain_over_start()
    summary = f"{report.ran} trial(s) run, {report.replayed} from the ledger, {report.wall_s:.1f}s"
    if gain is not None:
        summary += f"; best is {gain:+.1%} over the starting config"
    out.print(summary, markup=False)
    out.print(f"best config: {report.best_path} (stopped: {report.result.stop.value})", markup=False)
