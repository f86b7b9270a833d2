"""The trial protocol between the tuner and the engine: environment in, one JSON file out.

The tuner launches the user's unchanged script with four variables:

``ZERORUN_TRIAL_OVERRIDES``  JSON object of knob values, merged over whatever config the
                             script passes to ``initialize`` (``apply_overrides``)
``ZERORUN_TRIAL_WARMUP``     optimizer steps to run before timing (int >= 0)
``ZERORUN_TRIAL_STEPS``      timed optimizer steps (int >= 1)
``ZERORUN_TRIAL_RESULT``     the path the engine writes its result to

and the engine writes (atomically, rank 0 on success, any failing rank to
``<path>.rank<N>``)::

    {"status": "ok" | "oom" | "error", "median_step_s": float | null,
     "samples_per_s": float | null, "peak_bytes": int | null, "error": str | null,
     "step_times_s": [float, ...], "rank": int}

The engine wires it with two calls: ``apply_overrides(config, read_trial_overrides())``
before it reads its config, and ``recorder = TrialRecorder.from_env(rank, samples)``
then ``recorder.step_done()`` after every optimizer step (the recorder writes the
result and exits the process once the trial's steps are done; an uncaught exception
is recorded as ``oom`` or ``error`` by the hook it installs).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from types import TracebackType
from typing import Any

from zerorun import atomic_file
from zerorun.errors import ZerorunError

ENV_OVERRIDES = "ZERORUN_TRIAL_OVERRIDES"
ENV_STEPS = "ZERORUN_TRIAL_STEPS"
ENV_WARMUP = "ZERORUN_TRIAL_WARMUP"
ENV_RESULT = "ZERORUN_TRIAL_RESULT"
ENV_MEMORY_CAP = "ZERORUN_TEST_MEMORY_CAP_BYTES"
"""Tests only: a trial whose engine holds more bytes of model state than this raises
``TrialMemoryCapExceeded`` (a ``MemoryError``, so it is recorded as ``oom``), the way a
GPU run would raise ``torch.OutOfMemoryError``. Machines without GPUs have no other way
to make a candidate run out of memory."""

TOP_LEVEL_KNOBS = frozenset({"train_micro_batch_size_per_gpu", "gradient_accumulation_steps"})
"""Knobs that live at the top of the config; every other knob is a ``zero_optimization`` key."""


class ResultStatus(str, Enum):
    """What the engine saw: the trial ran, ran out of GPU memory, or raised something else."""

    OK = "ok"
    OOM = "oom"
    ERROR = "error"


class TrialProtocolError(ZerorunError):
    """The trial variables are malformed (set by hand, or by a mismatched zerorun)."""


class TrialMemoryCapExceeded(MemoryError):
    """The engine's model-state bytes passed ``ZERORUN_TEST_MEMORY_CAP_BYTES`` (tests only)."""


def memory_cap(environ: Mapping[str, str] | None = None) -> int | None:
    """The test memory cap in bytes, or None when unset."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV_MEMORY_CAP)
    if raw is None:
        return None
    if not raw.strip().isdigit():
        raise TrialProtocolError(f"{ENV_MEMORY_CAP}={raw!r} must be a number of bytes", hint=f"unset {ENV_MEMORY_CAP}")
    return int(raw)


def read_trial_overrides(environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """The knob values of this trial, or None when the process is not a trial."""
    env = os.environ if environ is None else environ
    raw = env.get(ENV_OVERRIDES)
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except json.JSONDecodeError as err:
        raise TrialProtocolError(
            f"{ENV_OVERRIDES} is not valid JSON ({err.msg} at column {err.colno})",
            hint=f"unset {ENV_OVERRIDES} unless `zerorun autotune` started this process",
        ) from None
    if not isinstance(value, dict):
        raise TrialProtocolError(f"{ENV_OVERRIDES} must be a JSON object of knob values", hint='e.g. {"reduce_bucket_size": 50000000}')
    return value


def apply_overrides(config: Mapping[str, Any], overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """A copy of ``config`` with the trial's knobs merged in (``config`` is left unchanged)."""
    merged = dict(config)
    if not overrides:
        return merged
    zero = dict(merged.get("zero_optimization") or {})
    for name, value in overrides.items():
        if name in TOP_LEVEL_KNOBS:
            merged[name] = value
        else:
            zero[name] = value
    merged["zero_optimization"] = zero
    if TOP_LEVEL_KNOBS & overrides.keys() and "train_batch_size" in merged:
        # the tuner holds the global batch fixed through these two; a stale triple would contradict them
        merged.pop("train_batch_size")
    return merged


def _positive_int(env: Mapping[str, str], name: str, minimum: int) -> int:
    raw = env.get(name, "")
    if not raw.strip().isdigit() or int(raw) < minimum:
        raise TrialProtocolError(f"{name}={raw!r} must be an integer >= {minimum}", hint="set by `zerorun autotune`")
    return int(raw)


@dataclass(frozen=True)
class TrialSpec:
    """One trial's instructions, as the environment carries them."""

    overrides: dict[str, Any]
    warmup: int
    steps: int
    result_path: Path

    def env(self) -> dict[str, str]:
        """The variables to add to the trial's environment."""
        return {
            ENV_OVERRIDES: json.dumps(self.overrides, sort_keys=True),
            ENV_WARMUP: str(self.warmup),
            ENV_STEPS: str(self.steps),
            ENV_RESULT: str(self.result_path),
        }

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TrialSpec | None:
        env = os.environ if environ is None else environ
        if ENV_RESULT not in env:
            return None
        return cls(
            overrides=read_trial_overrides(env) or {},
            warmup=_positive_int(env, ENV_WARMUP, 0),
            steps=_positive_int(env, ENV_STEPS, 1),
            result_path=Path(env[ENV_RESULT]),
        )


def write_json_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Write to a fresh ``mkstemp`` name beside ``path`` and rename: a reader sees the whole file or none,
    and no symlink planted at a guessable name receives it."""
    atomic_file.write_text(path, json.dumps(data, sort_keys=True))


def is_out_of_memory(exc: BaseException) -> bool:
    """By type, not by text: torch's ``OutOfMemoryError`` (CUDA) and Python's ``MemoryError``."""
    return isinstance(exc, MemoryError) or any(cls.__name__ == "OutOfMemoryError" for cls in type(exc).__mro__)


class TrialRecorder:
    """Engine side of a trial: times optimizer steps, writes the result, ends the process.

    ``peak_bytes`` returns this rank's peak memory (e.g. ``torch.cuda.max_memory_allocated``,
    or a max all-reduced over ranks); ``exit`` ends the process (``sys.exit`` by default).
    ``facts`` are written into the result as they are (e.g. the model's hidden size), and
``late_facts()`` is added to them when the steps are done (the memory held then);
    ``held_bytes`` and ``memory_cap`` implement the test memory cap (``ENV_MEMORY_CAP``).
    """

    def __init__(
        self,
        spec: TrialSpec,
        *,
        rank: int = 0,
        samples_per_step: int = 1,
        peak_bytes: Callable[[], int | None] | None = None,
        clock: Callable[[], float] = time.perf_counter,
        exit: Callable[[int], Any] = sys.exit,
        facts: Mapping[str, Any] | None = None,
        held_bytes: Callable[[], int] | None = None,
        memory_cap: int | None = None,
        late_facts: Callable[[], Mapping[str, Any]] | None = None,
    ) -> None:
        self.spec = spec
        self.rank = rank
        self.samples_per_step = samples_per_step
        self._peak = peak_bytes or (lambda: None)
        self._clock = clock
        self._exit = exit
        self.facts = dict(facts or {})
        self._held = held_bytes
        self._cap = memory_cap
        self._late = late_facts
        self._last = clock()
        self.steps_done = 0
        self.step_times: list[float] = []

    @classmethod
    def from_env(cls, rank: int = 0, samples_per_step: int = 1, **kwargs: Any) -> TrialRecorder | None:
        """A recorder when this process is a trial (and the failure hook installed), else None."""
        spec = TrialSpec.from_env()
        if spec is None:
            return None
        recorder = cls(spec, rank=rank, samples_per_step=samples_per_step, **kwargs)
        recorder.install_excepthook()
        return recorder

    def step_done(self) -> bool:
        """Call after every optimizer step; after warm-up + steps it writes and exits."""
        self.check_memory_cap()
        now = self._clock()
        if self.steps_done >= self.spec.warmup:
            self.step_times.append(now - self._last)
        self._last = now
        self.steps_done += 1
        if self.steps_done < self.spec.warmup + self.spec.steps:
            return False
        self.finish()
        return True

    def check_memory_cap(self) -> None:
        """Raise ``TrialMemoryCapExceeded`` when the test cap is set and exceeded."""
        if self._cap is None or self._held is None:
            return
        held = self._held()
        if held > self._cap:
            raise TrialMemoryCapExceeded(f"model state {held} bytes > test cap {self._cap} bytes ({ENV_MEMORY_CAP})")

    def result(self) -> dict[str, Any]:
        median = statistics.median(self.step_times) if self.step_times else None
        return {
            "status": ResultStatus.OK.value,
            "median_step_s": median,
            "samples_per_s": (self.samples_per_step / median) if median else None,
            "peak_bytes": self._peak(),
            "error": None,
            "step_times_s": self.step_times,
            "rank": self.rank,
            "facts": {**self.facts, **(self._late() if self._late is not None else {})},
        }

    def finish(self) -> None:
        """Rank 0 writes the result; every rank then exits cleanly."""
        if self.rank == 0:
            write_json_atomic(self.spec.result_path, self.result())
        self._exit(0)

    def record_failure(self, exc: BaseException) -> None:
        """Write ``oom`` or ``error`` for this rank, classified by the exception's type."""
        status = ResultStatus.OOM if is_out_of_memory(exc) else ResultStatus.ERROR
        path = self.spec.result_path.with_name(f"{self.spec.result_path.name}.rank{self.rank}")
        write_json_atomic(path, {
            "status": status.value, "median_step_s": None, "samples_per_s": None, "peak_bytes": self._peak(),
            "error": f"{type(exc).__name__}: {exc}"[:2000], "step_times_s": self.step_times, "rank": self.rank, "facts": self.facts,
        })

    def install_excepthook(self) -> None:
        """Record any uncaught exception before Python prints it and exits."""
        previous = sys.excepthook

        def hook(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
            with contextlib.suppress(Exception):  # recording must never hide the original error
                self.record_failure(exc)
            previous(kind, exc, tb)

        sys.excepthook = hook
