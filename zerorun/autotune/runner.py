"""One trial = one launcher run of the user's unchanged script, with the trial variables.

The command is exactly what a user runs (``python -m zerorun.cli [launcher options]
SCRIPT [args]``); the trial's knobs travel as ``ZERORUN_TRIAL_*`` variables, which the
launcher exports to every rank like any other ``ZERORUN_`` variable. The trial's
output goes to ``<dir>/output.log``; its outcome comes from the exit code, the tuner's
own timer and the files the engine wrote (``classify``), never from the output text.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from zerorun.autotune.classify import TrialOutcome, classify
from zerorun.trial.protocol import TrialSpec

TERM_GRACE_S = 20.0
"""After a timeout: seconds from SIGTERM (the launcher tears its ranks down) to SIGKILL."""


@dataclass(frozen=True)
class TrialRun:
    """What one trial left behind: its outcome, the engine's facts, its wall time and log."""

    outcome: TrialOutcome
    facts: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0
    log_path: Path | None = None


@dataclass(frozen=True)
class TrialRunner:
    """Runs trials of ``script`` through the launcher with ``launcher_args``.

    ``fixed`` knobs (e.g. a ``--stage`` other than the config's) go into every trial's
    overrides; ``env`` is added to the launcher's environment.
    """

    launcher_args: tuple[str, ...]
    script: str
    script_args: tuple[str, ...]
    warmup: int
    steps: int
    fixed: Mapping[str, Any] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)

    def command(self) -> list[str]:
        """The argv of one trial (the same code path as ``zerorun [options] SCRIPT [args]``)."""
        return [sys.executable, "-m", "zerorun.cli", *self.launcher_args, self.script, *self.script_args]

    def spec(self, knobs: Mapping[str, Any], trial_dir: Path) -> TrialSpec:
        return TrialSpec({**self.fixed, **knobs}, self.warmup, self.steps, trial_dir / "result.json")

    def run(self, knobs: Mapping[str, Any], trial_dir: Path, timeout_s: float | None) -> TrialRun:
        """Run one candidate; blocks until it ends or ``timeout_s`` passes."""
        trial_dir.mkdir(parents=True, exist_ok=True)
        spec = self.spec(knobs, trial_dir)
        for stale in trial_dir.glob("result.json*"):
            stale.unlink()
        env = {**os.environ, **self.env, **spec.env()}
        log_path = trial_dir / "output.log"
        start = time.monotonic()
        with open(log_path, "w", encoding="utf-8") as log:
            proc = subprocess.Popen(self.command(), env=env, stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
            timed_out = _wait(proc, timeout_s)
        duration = time.monotonic() - start
        outcome = classify(proc.returncode, spec.result_path, timed_out=timed_out)
        return TrialRun(outcome, _facts(spec.result_path), duration, log_path)


def _wait(proc: subprocess.Popen[bytes], timeout_s: float | None) -> bool:
    """Wait for ``proc``; at the timeout stop it (SIGTERM, then SIGKILL) and return True."""
    try:
        proc.wait(timeout=timeout_s)
        return False
    except subprocess.TimeoutExpired:
        _stop(proc)
        return True
    except BaseException:  # Ctrl-C: the trial has its own session, so stop it before leaving
        _stop(proc)
        raise


def _stop(proc: subprocess.Popen[bytes]) -> None:
    _signal_group(proc, signal.SIGTERM)
    try:
        proc.wait(timeout=TERM_GRACE_S)
    except subprocess.TimeoutExpired:
        _signal_group(proc, signal.SIGKILL)
        proc.wait()


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)  # the trial's own session: the launcher and anything it left


def _facts(result_path: Path) -> dict[str, Any]:
    """The engine's facts from rank 0's result (or any rank's failure record)."""
    for path in [result_path, *sorted(result_path.parent.glob(f"{result_path.name}.rank*"))]:
        with contextlib.suppress(OSError, json.JSONDecodeError):
            data = json.loads(path.read_text())
            if isinstance(data, dict) and isinstance(data.get("facts"), dict):
                return data["facts"]
    return {}
