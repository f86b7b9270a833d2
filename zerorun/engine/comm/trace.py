"""The engine's collectives, as the heartbeat sees them: the last one issued and the last one
completed (sequence number, kind, elements, dtype), and the time spent blocked in them.

Both are written into this process's progress record (:mod:`zerorun.heartbeat.state`) with
plain attribute stores, a few hundred nanoseconds a collective; the heartbeat thread samples
them. A rank whose last completed collective trails its peers' is the one they wait for; the
time blocked per step separates a rank that is slow (it computes) from its peers (they wait).
"""

from __future__ import annotations

import time

import torch

from zerorun.engine.comm.comms_logger import LOGGER
from zerorun.heartbeat.state import PROGRESS

Record = tuple[int, str, int, str]
"""``(seq, kind, elements, dtype)``."""

_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float64: "fp64",
                torch.int64: "int64", torch.int32: "int32", torch.uint8: "uint8", torch.int8: "int8",
                torch.bool: "bool"}


_BY_NAME = {name: dtype for dtype, name in _DTYPE_NAMES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    return _DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def issue(kind: str, numel: int, dtype: torch.dtype, label: str | None = None) -> Record:
    """Number the next collective and note it as the last issued (``label``: what it is for)."""
    PROGRESS.seq += 1
    PROGRESS.label = label
    record = (PROGRESS.seq, kind, numel, dtype_name(dtype))
    PROGRESS.issued = record
    PROGRESS.note_issue(*record)  # the launcher's order check (zerorun.heartbeat.state)
    return record


def complete(record: Record, issued_at: float) -> None:
    """Note ``record`` (issued at ``issued_at``, ``time.perf_counter()``) as completed now; the
    communication logger (``comms_logger`` block) records it here, the one place, when enabled."""
    done = PROGRESS.completed
    if done is None or record[0] > done[0]:
        PROGRESS.completed = record
    if LOGGER.enabled:
        LOGGER.record_engine_op(record[1], record[2] * itemsize(record[3]), time.perf_counter() - issued_at)


def itemsize(name: str) -> int:
    """Bytes per element of a dtype named as :func:`dtype_name` names it."""
    dtype = _BY_NAME.get(name) or getattr(torch, name, None)
    return dtype.itemsize if isinstance(dtype, torch.dtype) else 0


def blocked_since(start: float) -> None:
    """Count the seconds since ``start`` (``time.perf_counter()``) as time blocked in a collective."""
    PROGRESS.wait_s += time.perf_counter() - start
