"""The collective-order check, on by default: every rank issues the same collectives in the same order.

A rank that issues ``reduce_scatter`` where its peers issue ``all_gather`` (a data-dependent
branch, a model built in another order) makes gloo or NCCL pair the wrong buffers: a wrong
sum, or a hang with no name. Each rank records every collective it issues in a small ring
and a running fingerprint (zerorun.heartbeat.state, a ring append and a multiply: no
communication), and sends them with its heartbeat. The launcher compares them lazily, as
torch's flight recorder is read: the records of the same sequence number, and the
fingerprints at the same sequence number (kept at multiples of 8, 64, 512, ... so ranks
that beat at different moments report some of the same ones). A difference names the first
collective where the ranks parted::

    collective order differs between ranks: rank 1 issued reduce_scatter(4096 fp32) as #311 where rank 0 issued all_gather(8192 bf16)

Only what every live rank has passed is compared: ranks that part and then hang are the stall
diagnosis's (launcher.watch.stall, which names where each one waits); ranks that part and go
on - the silent wrong sum - are this check's. Pure: the board's latest beats in, a message or
None out. The strict mode that checks
before every collective runs (``ZERORUN_CHECK_COLLECTIVES=order``, one exchange per
collective) stays in the engine; ``ZERORUN_ORDER_RING=0`` turns the recording off.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

from launcher.watch.heartbeats import Board
from zerorun.heartbeat.state import DTYPES, KINDS, name_code

_KIND = {name_code(k): k for k in KINDS}
_DTYPE = {name_code(d): d for d in DTYPES}
KEPT_MARKS = 64
ORDER_EXIT = 1
"""The launcher's exit status after stopping a run whose ranks' collectives differ."""


def describe(record: tuple[int, ...]) -> str:
    _, kind, numel, dtype = record
    name = _KIND.get(kind, f"collective {kind}")
    return f"{name}({numel} {_DTYPE.get(dtype, '?')})" if numel else f"{name}()"


class OrderWatch:
    """Every rank's fingerprints seen so far (the last ``KEPT_MARKS``), and the comparison."""

    def __init__(self) -> None:
        self.marks: dict[int, OrderedDict[int, int]] = {}

    def take(self, rank: int, beat: dict[str, Any]) -> None:
        order = beat.get("order")
        if not isinstance(order, dict):
            return
        kept = self.marks.setdefault(rank, OrderedDict())
        for seq, fingerprint in order.get("marks") or []:
            kept[seq] = fingerprint
            kept.move_to_end(seq)
        while len(kept) > KEPT_MARKS:
            kept.popitem(last=False)

    def mismatch(self, board: Board) -> str | None:
        """The first difference among the live ranks' records, or None (also while some send none)."""
        ranks = sorted(r for r, s in board.ranks.items() if s.alive)
        rings = {r: _ring(board.ranks[r].beat) for r in ranks}
        if len(ranks) < 2 or any(not ring for ring in rings.values()):
            return None
        text = _ring_difference(rings)
        if text is not None:
            return text
        if any(r not in self.marks for r in ranks):
            return None
        common = set.intersection(*(set(self.marks[r]) for r in ranks))
        for seq in sorted(common):
            groups = _groups({r: self.marks[r][seq] for r in ranks})
            if len(groups) > 1:
                ref, *others = groups
                return "; ".join(f"{_who(g)} issued other collectives than {_who(ref)} before #{seq} (their running "
                                 "fingerprints differ; the kept records do not reach back to where they parted)"
                                 for g in others)
        return None


def _ring(beat: dict[str, Any] | None) -> dict[int, tuple[int, ...]]:
    order = (beat or {}).get("order")
    ring = order.get("ring") if isinstance(order, dict) else None
    return {int(r[0]): tuple(r) for r in ring or []}


def _groups(values: dict[int, Any]) -> list[list[int]]:
    """Ranks grouped by value, the largest group (the lowest rank's on a tie) first."""
    by: dict[Any, list[int]] = {}
    for rank, value in sorted(values.items()):
        by.setdefault(value, []).append(rank)
    return sorted(by.values(), key=lambda g: (-len(g), g[0]))


def _who(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))


def _ring_difference(rings: dict[int, dict[int, tuple[int, ...]]]) -> str | None:
    common = set.intersection(*(set(ring) for ring in rings.values()))
    for seq in sorted(common):
        groups = _groups({r: ring[seq] for r, ring in rings.items()})
        if len(groups) > 1:
            ref, *others = groups
            said = describe(rings[ref[0]][seq])
            return "; ".join(f"{_who(g)} issued {describe(rings[g[0]][seq])} as #{seq} where {_who(ref)} issued {said}"
                             for g in others)
    return None
