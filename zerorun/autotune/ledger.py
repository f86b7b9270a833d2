"""The tuner's append-only ledger: one JSON line per finished (or pruned, or failed) trial.

Records are keyed by a run key, the hash of the starting config, the script's bytes
and its arguments, so a rerun of the same tuning resumes and skips finished trials,
and a changed config or script starts afresh in the same file. Nothing is ever
deleted; a torn last line (a crash mid-write) is ignored, and the next record still
starts a line of its own, so the tear never swallows it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from zerorun.autotune.classify import Outcome, TrialOutcome


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def run_key(config: Mapping[str, Any], script: str | Path, script_args: Sequence[str] = ()) -> str:
    """Hash of the starting config, the script's content and its arguments."""
    digest = hashlib.sha256()
    digest.update(_canonical(config).encode())
    path = Path(script)
    digest.update(path.read_bytes() if path.is_file() else str(script).encode())
    digest.update(_canonical(list(script_args)).encode())
    return digest.hexdigest()[:16]


def knob_key(knobs: Mapping[str, Any]) -> str:
    """The identity of one candidate: its knob values, order-free."""
    return _canonical(dict(knobs))


@dataclass(frozen=True)
class TrialRecord:
    """One line of the ledger."""

    run_key: str
    knobs: dict[str, Any]
    status: Outcome
    median_step_s: float | None = None
    samples_per_s: float | None = None
    peak_bytes: int | None = None
    predicted_bytes: int | None = None
    reason: str = ""
    duration_s: float = 0.0
    facts: dict[str, Any] = field(default_factory=dict)  # what the engine reported (hidden size, ...)
    recorded_at: float = field(default_factory=time.time)
    repeat: int = 0  # which measurement of this candidate (each candidate runs several times)
    spread: float | None = None  # aggregated records only: the spread over the repeats

    @classmethod
    def from_outcome(cls, key: str, knobs: Mapping[str, Any], outcome: TrialOutcome, **extra: Any) -> TrialRecord:
        return cls(
            run_key=key, knobs=dict(knobs), status=outcome.status, median_step_s=outcome.median_step_s,
            samples_per_s=outcome.samples_per_s, peak_bytes=outcome.peak_bytes, reason=outcome.reason, **extra,
        )

    def outcome(self) -> TrialOutcome:
        return TrialOutcome(self.status, self.median_step_s, self.samples_per_s, self.peak_bytes, self.reason,
                            self.spread)

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "status": self.status.value}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrialRecord:
        known = {k: data[k] for k in cls.__dataclass_fields__ if k in data}
        return cls(**{**known, "status": Outcome(data["status"])})


def _ends_with_newline(path: Path) -> bool:
    with open(path, "rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1) == b"\n"


def _parse(line: str) -> TrialRecord | None:
    """The record on ``line``; a torn or foreign line gives None, never an error. A line where an
    older writer appended a record right after a torn one yields that record (the last object)."""
    decoder = json.JSONDecoder()
    start = 0
    while start >= 0:
        try:
            data, end = decoder.raw_decode(line, start)
            if line[end:].strip() == "" and isinstance(data, dict):
                return TrialRecord.from_json(data)
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            pass
        start = line.find("{", start + 1)
    return None


class Ledger:
    """The JSONL file at ``path``; appends are flushed and fsynced one line at a time."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def append(self, record: TrialRecord) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps(record.to_json(), sort_keys=True) + "\n"
        with open(self.path, "ab") as f:
            if f.tell() > 0 and not _ends_with_newline(self.path):
                line = "\n" + line  # the last line was torn by a crash: this record starts a line of its own
            f.write(line.encode())
            f.flush()
            os.fsync(f.fileno())

    def __iter__(self) -> Iterator[TrialRecord]:
        if not self.path.exists():
            return
        with open(self.path, encoding="utf-8", errors="replace") as f:  # a torn multi-byte character too
            for line in f:
                record = _parse(line)
                if record is not None:
                    yield record

    def records(self, key: str) -> list[TrialRecord]:
        """Every record of one run, in the order they were written."""
        return [r for r in self if r.run_key == key]

    def done(self, key: str) -> dict[str, TrialRecord]:
        """knob_key -> the latest record of each candidate already tried in this run."""
        return {knob_key(r.knobs): r for r in self.records(key)}

    def done_repeats(self, key: str) -> dict[tuple[str, int], TrialRecord]:
        """(knob_key, repeat) -> the latest record of each measurement already taken in this run."""
        return {(knob_key(r.knobs), r.repeat): r for r in self.records(key)}
