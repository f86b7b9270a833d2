"""The doctor's real collective: the plan launched as a launch would run it, every rank running
launcher/doctor/collective_rank.py (a gloo all-reduce, NCCL too on GPUs, the node-pair latency and
bandwidth matrix), judged here. It is a launch (the launcher's own command line, its runner,
its preflight and interface export), so what passes here is what a training job meets.

A launch that fails is ``collective_failed`` with the launcher's last lines; one that
does not finish in time is ``collective_hang``: the cheap checks reach the master port
only, while the ranks also connect to each other on ports gloo and NCCL pick.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from launcher.doctor.verdicts import Finding, Problem

TAG = "zerorun-doctor-collective"
GROUP_TIMEOUT = 30.0
"""Seconds any of the ranks' collectives may wait (gloo's timeout)."""
START_ALLOWANCE = 120.0
"""Seconds on top for the launch itself (ssh, the agents, every rank importing torch)."""
_FIX = ("the ranks also connect to each other, on ports gloo and NCCL choose: open TCP between the hosts "
        "(not only the master port), and check the *_SOCKET_IFNAME the launch exports or you set")


@dataclass(frozen=True)
class CollectiveReport:
    """What the collective launch found: its rank 0's answer (None when it gave none) and the findings."""

    hosts: tuple[str, ...]
    result: dict[str, Any] | None
    findings: tuple[Finding, ...]
    seconds: float
    skipped: str | None = None
    links: tuple[dict[str, Any], ...] = field(default=())

    @property
    def slowest(self) -> dict[str, Any] | None:
        """The link with the lowest bandwidth, or None for a single node."""
        return min(self.links, key=lambda link: link["bytes_per_s"]) if self.links else None

    def to_dict(self) -> dict[str, Any]:
        return {"ran": self.skipped is None, "skipped": self.skipped, "seconds": round(self.seconds, 3),
                "result": self.result, "links": list(self.links), "slowest": self.slowest,
                "findings": [f.to_dict() for f in self.findings]}


def collective_argv(launch_flags: Sequence[str]) -> list[str]:
    """The launcher's command line that runs the collective on the plan ``launch_flags`` make."""
    return [sys.executable, "-m", "zerorun.cli", *launch_flags, "--kill_timeout", "3",
            "--module", "launcher.doctor.collective_rank", str(GROUP_TIMEOUT)]


def _run(argv: list[str], timeout: float) -> tuple[int | None, str, str]:
    """The launch's status (None: it did not finish in ``timeout``; it was then stopped) and its output."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the launcher tears its ranks down on every host
        try:
            out, err = proc.communicate(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        return None, out, err


def _answer(stdout: str) -> dict[str, Any] | None:
    for line in stdout.splitlines():
        _, tag, rest = line.partition(TAG + " ")  # the launcher prefixes the rank's line with [host:rank]
        if tag:
            return dict(json.loads(rest))
    return None


def _tail(out: str, err: str) -> str:
    """The ranks' last lines and the launcher's own failure lines (not its summary box)."""
    ranks = [line for line in out.splitlines() if line.startswith("[")][-4:]
    said = [line for line in (err + out).splitlines() if line.startswith("zerorun: ") and "fail" in line][:2]
    return "\n    ".join(ranks + said) or "(no output)"


def judge(hosts: Sequence[str], code: int | None, out: str, err: str, timeout: float) -> tuple[dict[str, Any] | None, list[Finding]]:
    """The launch's result and what is wrong with it (nothing, when every collective summed right)."""
    where, result = hosts[0], _answer(out)
    if code is None:
        return result, [Finding(where, Problem.COLLECTIVE_HANG, f"the collective over {', '.join(hosts)} did not finish "
                                f"within {timeout:.0f} s:\n    {_tail(out, err)}", _FIX)]
    if code != 0 or result is None:
        return result, [Finding(where, Problem.COLLECTIVE_FAILED, f"the collective launch over {', '.join(hosts)} "
                                f"failed (status {code}):\n    {_tail(out, err)}", _FIX)]
    found = []
    for backend in ("gloo", "nccl"):
        if result.get(f"{backend}_ok") is False:
            found.append(Finding(where, Problem.COLLECTIVE_FAILED, f"the {backend} all-reduce over "
                                 f"{result['world']} ranks gave a wrong sum", "check the ranks' devices and libraries"))
    return result, found


def run_collective(launch_flags: Sequence[str], hosts: Sequence[str]) -> CollectiveReport:
    """Launch the collective on the plan the flags make (``hosts`` in node order); never raises for its failure."""
    start, timeout = time.time(), GROUP_TIMEOUT + START_ALLOWANCE
    code, out, err = _run(collective_argv(launch_flags), timeout)
    result, found = judge(hosts, code, out, err, timeout)
    links = tuple({"a": hosts[x["a"]], "b": hosts[x["b"]], "latency_us": round(x["latency_s"] * 1e6, 1),
                   "bytes_per_s": x["bytes_per_s"]} for x in (result or {}).get("links", []))
    return CollectiveReport(tuple(hosts), result, tuple(found), time.time() - start, links=links)


def skipped(hosts: Sequence[str], why: str) -> CollectiveReport:
    return CollectiveReport(tuple(hosts), None, (), 0.0, skipped=why)
