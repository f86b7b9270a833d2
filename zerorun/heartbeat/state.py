"""What this process is doing, as the heartbeat reports it: one small record the engine and
:func:`zerorun.progress` write with plain attribute stores, and the heartbeat thread reads.

The record is process-wide on purpose: a rank is one process, and every engine, every
``zero.Init`` and the script's own ``zerorun.progress`` calls describe the same process
(they share the collective sequence too, so the sequence number a verdict prints means
the same collective on every rank). Writes are single attribute stores, atomic under the
GIL; the reader takes a consistent-enough copy (a beat is a sample, not a transaction).
"""

from __future__ import annotations

import os
import time
import zlib
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

STEP_HISTORY = 256
"""Step records kept between two beats (a beat drains them): bounded, so a stalled reader costs nothing."""


ORDER_RING = 16
"""Collectives each rank keeps for the launcher's order check (the last ones issued)."""
ORDER_LEVELS = (8, 64, 512, 4096, 32768)
"""Sequence numbers whose running fingerprint is kept: the latest multiple of each (ranks that
beat at different moments still report some of the same ones)."""
ORDER_ENV = "ZERORUN_ORDER_RING"
_MASK = (1 << 62) - 1
_PRIME = 0x100000001B3
KINDS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_true", "all_gather_object")
DTYPES = ("fp32", "fp16", "bf16", "fp64", "int64", "int32", "uint8", "int8", "bool")
_CODES: dict[str, int] = {name: i for i, name in enumerate((*KINDS, *DTYPES), 1)}


def name_code(name: str) -> int:
    """A small code for a collective's kind or dtype, the same in every process (no hash seed):
    the known names by their place, another name by a checksum (128-255)."""
    code = _CODES.get(name)
    if code is None:
        code = _CODES[name] = 128 + zlib.crc32(name.encode()) % 128
    return code


class Phase:
    """The phases a heartbeat names (a user's own name, via ``zerorun.progress``, is any short string)."""

    SETUP = "set-up"
    FORWARD = "forward"
    BACKWARD = "backward"
    STEP = "step"
    SAVE = "checkpoint-save"
    LOAD = "checkpoint-load"
    EXITING = "exiting"
    """After the script's end: process groups destroyed, the interpreter torn down."""
    EXITING_AFTER_ERROR = "exiting after an error"
    """The same, after an exception the script did not catch ended it (training did not complete)."""
    SCRIPT = "script"
    """Between engine calls: the script's own code (data loading, logging, evaluation)."""


IO_PHASES = frozenset({Phase.SAVE, Phase.LOAD})
"""Phases whose file I/O counts as progress (a long checkpoint write is work, not a stall)."""


@dataclass
class Progress:
    """The live record of one rank's progress."""

    phase: str = Phase.SETUP
    phase_since: float = field(default_factory=time.time)
    step: int = 0
    """Optimizer steps taken (the engine's ``global_steps``)."""
    micro_step: int = 0
    seq: int = 0
    """Collectives issued by the engine in this process (the number a verdict prints: ``#1842``)."""
    issued: tuple[int, str, int, str] | None = None
    """``(seq, kind, elements, dtype)`` of the last collective issued."""
    completed: tuple[int, str, int, str] | None = None
    """The same of the last one completed (waited for)."""
    label: str | None = None
    """What the collective in flight is for (a stage-3 unit's name), when the engine knows."""
    wait_s: float = 0.0
    """Seconds spent blocked in collectives since the process started."""
    samples_per_step: int | None = None
    tokens_per_sample: int | None = None
    steps: deque[tuple[int, float, float]] = field(default_factory=lambda: deque(maxlen=STEP_HISTORY))
    """``(step, seconds, seconds waiting in collectives)`` of each optimizer step since the last beat."""
    user: dict[str, float | int | str] = field(default_factory=dict)
    """The counters of the last ``zerorun.progress(...)`` call."""
    beats: int = 0
    """Progress marks from ``zerorun.progress``: each call is progress, even with nothing else new."""
    record_order: bool = field(default_factory=lambda: os.environ.get(ORDER_ENV, "1").strip() != "0")
    """Keep the collectives' ring and fingerprints for the launcher's order check (``ZERORUN_ORDER_RING=0``: off)."""
    order_ring: deque[tuple[int, int, int, int]] = field(default_factory=lambda: deque(maxlen=ORDER_RING))
    """``(seq, kind code, elements, dtype code)`` of the last collectives issued."""
    fingerprint: int = 0
    """A running fingerprint of every collective issued, in order."""
    fingerprints: dict[int, tuple[int, int]] = field(default_factory=dict)
    """Level -> ``(seq, fingerprint)`` at the latest seq that is a multiple of the level (``ORDER_LEVELS``)."""
    _step_started: float = field(default_factory=time.perf_counter)
    _wait_at_step: float = 0.0

    def enter(self, phase: str) -> None:
        if phase != self.phase:
            if self.phase == Phase.SETUP:  # the first step's time starts at its own first phase
                self._step_started, self._wait_at_step = time.perf_counter(), self.wait_s
            self.phase = phase
            self.phase_since = time.time()

    @contextmanager
    def during(self, phase: str) -> Iterator[None]:
        """``phase`` for the block, then the phase before it again."""
        before = self.phase
        self.enter(phase)
        try:
            yield
        finally:
            self.enter(before)

    def step_done(self, step: int) -> None:
        """An optimizer step finished: record its wall time and the part of it spent waiting."""
        now = time.perf_counter()
        self.steps.append((step, now - self._step_started, self.wait_s - self._wait_at_step))
        self._step_started, self._wait_at_step = now, self.wait_s
        self.step = step

    def note_issue(self, seq: int, kind: str, numel: int, dtype: str) -> None:
        """Record collective ``seq`` for the order check: a ring append and a multiply, no communication
        (the launcher compares the ranks' records lazily, from their heartbeats, as torch's flight
        recorder is read after the fact)."""
        if not self.record_order:
            return
        entry = (seq, name_code(kind), numel, name_code(dtype))
        self.order_ring.append(entry)
        self.fingerprint = ((self.fingerprint * _PRIME) ^ (entry[1] << 54 ^ entry[3] << 46 ^ numel)) & _MASK
        if not seq & 7:
            for level in ORDER_LEVELS:
                if seq % level:
                    break
                self.fingerprints[level] = (seq, self.fingerprint)

    def drain_steps(self) -> list[tuple[int, float, float]]:
        out = []
        while self.steps:
            out.append(self.steps.popleft())
        return out


PROGRESS = Progress()
"""This process's record (see the module docstring for why it is one per process)."""
