"""The preflight's cost before a multi-node launch: the ssh check alone, the doctor's cheap
network checks alone, and the whole preflight (both at once), each the median of ``--repeats`` runs, on
the plan the launcher's own flags make (no rank starts).

    python bench/preflight_time.py --repeats 5 -- -H hostfile --launcher ssh --ssh_args '-i key'
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import time
from collections.abc import Callable

from launcher.args import parse_args
from launcher.doctor.preflight import network_preflight, preflight, ssh_check
from launcher.main import make_plan, resolve_nodes, ssh_options


def _median(fn: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        with contextlib.redirect_stderr(io.StringIO()):  # the interface line, once per run
            fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("launcher_flags", nargs=argparse.REMAINDER, help="after --: the launch's flags")
    args = ap.parse_args()
    flags = [f for f in args.launcher_flags if f != "--"]
    ns = parse_args([*flags, "t.py"])
    nodes, local = resolve_nodes(ns)
    plan, _ = make_plan(ns, nodes, local)
    ssh = ssh_options(ns)
    alone = _median(lambda: ssh_check(plan, ssh), args.repeats)
    network = _median(lambda: network_preflight(plan, ssh), args.repeats)
    whole = _median(lambda: preflight(plan, ssh), args.repeats)
    print(f"{len(plan.nodes)} nodes, median of {args.repeats} runs")
    print(f"ssh check alone (reachable, versions, cwd)    {alone:6.2f} s")
    print(f"network checks alone (the doctor's cheap part) {network:6.2f} s")
    print(f"whole preflight (both at once)                 {whole:6.2f} s")
    print(f"added by the network checks                    {whole - alone:+6.2f} s")


if __name__ == "__main__":
    main()
