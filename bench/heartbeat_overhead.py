"""The cost of watching a run: step time with the heartbeat off, on, and on with the collective
order check (``ZERORUN_CHECK_COLLECTIVES=order``), at stages 0-3, launched by zerorun.

    python bench/heartbeat_overhead.py --ranks 2 --steps 40 --repeats 2

Each run trains a 4-layer MLP (hidden 1024, ~4.2M parameters, fp32, SGD) for ``--steps``
steps on gloo; rank 0 prints the median step time of the steps after the first 5. The
modes of one stage run interleaved (off, on, order, off, on, order, ...) so drift in the
machine's load falls on each alike; the figure is the median over the repeats. The
always-on part (each collective noting itself in the progress record) is in every mode:
its cost per collective is timed alone, in-process, as ``trace_ns``. In the heartbeat run (the
default, whose lazy order check records every collective in a ring for the launcher to compare)
each rank then runs ``--steps`` more steps with the recording on and off in alternating pairs
(``a/b lazy order``), and times one record alone (``note_ns``). In the strict order-check run
each rank then runs ``--steps`` more steps with the check on and off in alternating pairs
(``a/b``): the same process, the same moment, no launch between them, so the machine's
load falls on both alike (``--modes heartbeat+order`` runs only that).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

RANK_SCRIPT = textwrap.dedent("""\
    import json, os, statistics, sys, time
    import torch
    from torch import nn
    import zerorun
    stage, steps = int(sys.argv[1]), int(sys.argv[2])
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(1024, 1024) for _ in range(4)])
    cfg = {"train_micro_batch_size_per_gpu": 8, "optimizer": {"type": "SGD", "params": {"lr": 0.01}},
           "zero_optimization": {"stage": stage}}
    engine, *_ = zerorun.initialize(model=model, config=cfg)
    x = torch.randn(8, 1024)
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.backward(engine(x).square().mean()); engine.step()
        times.append(time.perf_counter() - t0)
    calls = sum(row["calls"] for row in engine.comm_stats().values())
    out = {"step_s": statistics.median(times[5:]), "collectives_per_step": calls / steps}
    from zerorun.heartbeat.channel import beat
    from zerorun.heartbeat.state import PROGRESS
    t0 = time.perf_counter()
    for _ in range(200):
        json.dumps(beat(PROGRESS, True))
    out["beat_us"] = (time.perf_counter() - t0) / 200 * 1e6
    if engine.coll.order is not None:  # the check on and off in alternating pairs of steps, in this process
        check, ab = engine.coll.order, {True: [], False: []}
        for i in range(steps):
            on = (i // 2) % 2 == 0  # every rank toggles alike, so their checks stay paired
            engine.coll.order = check if on else None
            t0 = time.perf_counter()
            engine.backward(engine(x).square().mean()); engine.step()
            ab[on].append(time.perf_counter() - t0)
        engine.coll.order = check
        out["ab_on_s"], out["ab_off_s"] = statistics.median(ab[True]), statistics.median(ab[False])
    if engine.coll.order is not None:  # one check alone, on every rank (the same calls, so they agree)
        t0 = time.perf_counter()
        for i in range(200):
            engine.coll.order.issue(10**6 + i, "all_gather", 4096, "fp32")
        out["check_us"] = (time.perf_counter() - t0) / 200 * 1e6
    from zerorun.heartbeat.state import PROGRESS as P
    if P.record_order and engine.coll.order is None:  # the default, lazy order check: its recording on and off
        lazy = {True: [], False: []}  # in alternating pairs of steps, in this process (no exchange to pair)
        for i in range(steps):
            on = (i // 2) % 2 == 0
            P.record_order = on
            t0 = time.perf_counter()
            engine.backward(engine(x).square().mean()); engine.step()
            lazy[on].append(time.perf_counter() - t0)
        P.record_order = True
        out["lazy_on_s"], out["lazy_off_s"] = statistics.median(lazy[True]), statistics.median(lazy[False])
        t0 = time.perf_counter()
        for i in range(20000):
            P.note_issue(10**7 + i, "all_gather", 4096, "fp32")
        out["note_ns"] = (time.perf_counter() - t0) / 20000 * 1e9
    if int(os.environ["RANK"]) == 0:
        print("RESULT " + json.dumps(out), flush=True)
""")
MODES = {"off": ["--env", "ZERORUN_HEARTBEAT=0"], "heartbeat": [],
         "heartbeat+order": ["--env", "ZERORUN_CHECK_COLLECTIVES=order"]}


def one(script: Path, ranks: int, stage: int, steps: int, mode: str) -> dict[str, float]:
    argv = [sys.executable, "-m", "zerorun.cli", "--num_gpus", str(ranks), "--master_port", "auto", "--quiet", "--no_local_rank",
            *MODES[mode], str(script), str(stage), str(steps)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=True).stdout
    line = next(x for x in out.splitlines() if "RESULT " in x)
    return dict(json.loads(line.split("RESULT ", 1)[1]))


def trace_ns(n: int = 200_000) -> float:
    """Nanoseconds one collective spends noting itself (issue + complete + blocked time)."""
    import torch

    from zerorun.engine.comm import trace

    t0 = time.perf_counter()
    for _ in range(n):
        start = time.perf_counter()
        record = trace.issue("all_gather", 4096, torch.float32)
        trace.blocked_since(start)
        trace.complete(record)
    return (time.perf_counter() - t0) / n * 1e9


def summarize(runs: dict[str, list[dict[str, float]]], beat_s: float) -> dict[str, float]:
    """Measured step times (ms, median over repeats) per mode run, and the overhead each part costs by
    its own timing: a beat's cost once per ``beat_s``, a check's cost per collective of a step."""
    med = {m: statistics.median(r["step_s"] for r in v) for m, v in runs.items()}
    out: dict[str, float] = {f"{m} ms": round(v * 1000, 2) for m, v in med.items()}
    if "off" in med:
        out.update({f"{m} vs off %": round(100 * (med[m] / med["off"] - 1), 1) for m in med if m != "off"})
    if "heartbeat" in runs:
        beat_us = statistics.median(r["beat_us"] for r in runs["heartbeat"])
        out.update({"beat us": round(beat_us, 1), "beat % of time": round(100 * beat_us * 1e-6 / beat_s, 3)})
        if all("lazy_on_s" in r for r in runs["heartbeat"]):  # the default order check, in-process a/b
            on = statistics.median(r["lazy_on_s"] for r in runs["heartbeat"])
            off = statistics.median(r["lazy_off_s"] for r in runs["heartbeat"])
            out.update({"a/b unrecorded ms": round(off * 1000, 2), "a/b lazy order ms": round(on * 1000, 2),
                        "a/b lazy order vs unrecorded %": round(100 * (on / off - 1), 1),
                        "note ns": round(statistics.median(r["note_ns"] for r in runs["heartbeat"]), 1)})
            per_step = runs["heartbeat"][0]["collectives_per_step"]
            out.update({"collectives/step": per_step, "lazy order % of step (timed)":
                        round(100 * per_step * out["note ns"] * 1e-9 / off, 3)})
    if "heartbeat+order" in runs:
        order = runs["heartbeat+order"]
        per_step, check_us = order[0]["collectives_per_step"], statistics.median(r["check_us"] for r in order)
        step_s = med.get("off", statistics.median(r["ab_off_s"] for r in order))
        out.update({"collectives/step": per_step, "check us": round(check_us, 1),
                    "check % of step": round(100 * per_step * check_us * 1e-6 / step_s, 1), **_ab(order)})
    return out


def _ab(order_runs: list[dict[str, float]]) -> dict[str, float]:
    """The order check on against off in the same process (pairs of steps interleaved): launch-free."""
    on = statistics.median(r["ab_on_s"] for r in order_runs)
    off = statistics.median(r["ab_off_s"] for r in order_runs)
    return {"a/b off ms": round(off * 1000, 2), "a/b order ms": round(on * 1000, 2),
            "a/b order vs off %": round(100 * (on / off - 1), 1)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--stages", default="0,1,2,3")
    p.add_argument("--modes", default=",".join(MODES),
                   help="which runs: off, heartbeat, heartbeat+order (the in-process a/b needs only the last)")
    p.add_argument("--beat_s", type=float, default=1.0, help="the heartbeat interval the ranks use (default 1 s)")
    args = p.parse_args()
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "rank.py"
        script.write_text(RANK_SCRIPT)
        for stage in map(int, args.stages.split(",")):
            modes = args.modes.split(",")
            runs: dict[str, list[dict[str, float]]] = {m: [] for m in modes}
            for _ in range(args.repeats):
                for mode in modes:
                    runs[mode].append(one(script, args.ranks, stage, args.steps, mode))
            results[f"stage {stage}"] = row = summarize(runs, args.beat_s)
            print(f"stage {stage}: " + json.dumps(row), flush=True)
    print(json.dumps({"ranks": args.ranks, "steps": args.steps, "repeats": args.repeats,
                      "step_ms": results, "trace_ns_per_collective": round(trace_ns(), 1)}, indent=2))


if __name__ == "__main__":
    main()
