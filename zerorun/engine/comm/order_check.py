"""``ZERORUN_CHECK_COLLECTIVES=order``: every rank issues the same collectives in the same order,
checked on every backend before each collective runs.

A rank that issues ``reduce_scatter`` where its peers issue ``all_gather`` (a data-dependent
branch, a parameter order that differs between ranks) makes gloo or NCCL pair the wrong
buffers: a wrong sum, or a hang with no name. In this mode each rank keeps a running
fingerprint of ``(kind, elements, dtype)`` over every collective it issued and, before
collective number ``seq`` runs, the ranks exchange one fixed-size record
``(seq, kind, elements, dtype, fingerprint)`` (an all-gather of ``5 x world`` int64, on a
CPU group: the engine's own when it serves the CPU, else a gloo group made for the check,
so NCCL streams are never synchronised). The cost is bounded: one small exchange per
collective, or per ``every`` collectives (``ZERORUN_CHECK_ORDER_EVERY``) with the last
:data:`RING` records kept to name where the sequences parted. Every rank sees the same
records, so a mismatch raises :class:`CollectiveOrderError` on every rank, naming both
sides::

    rank 2 issued reduce_scatter(4096 fp32) as #311 where ranks 0,1,3 issued all_gather(8192 bf16)
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Mapping

import torch
import torch.distributed as dist

from zerorun.engine.errors import EngineError

EVERY_ENV = "ZERORUN_CHECK_ORDER_EVERY"
RING = 64
KINDS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast", "all_true", "all_gather_object")
DTYPES = ("fp32", "fp16", "bf16", "fp64", "int64", "int32", "uint8", "int8", "bool")
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor  # torch 2.13 renames it
_MASK = (1 << 62) - 1
_PRIME = 0x100000001B3


class CollectiveOrderError(EngineError):
    """The ranks did not issue the same collective at the same point."""


def _code(name: str, names: tuple[str, ...]) -> int:
    return names.index(name) + 1 if name in names else 0


def _name(code: int, names: tuple[str, ...]) -> str:
    return names[code - 1] if 0 < code <= len(names) else "?"


def describe(kind: int, numel: int, dtype: int) -> str:
    """``all_gather(8192 bf16)``; a collective of objects has no size: ``all_gather_object()``."""
    return f"{_name(kind, KINDS)}({numel} {_name(dtype, DTYPES)})" if numel else f"{_name(kind, KINDS)}()"


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ",".join(map(str, ranks))


def mismatch_message(rows: list[list[int]]) -> str | None:
    """The mismatch among every rank's ``(seq, kind, elements, dtype, fingerprint)``, or None.

    The ranks split into groups by what they issued; the largest group (rank 0's on a tie)
    is the reference and each other group is named against it.
    """
    groups: dict[tuple[int, ...], list[int]] = {}
    for rank, row in enumerate(rows):
        groups.setdefault(tuple(row[1:5]), []).append(rank)
    if len(groups) == 1:
        return None
    ref_key = max(groups, key=lambda k: (len(groups[k]), -groups[k][0]))
    ref = groups[ref_key]
    parts = []
    for key, ranks in groups.items():
        if key == ref_key:
            continue
        if key[:3] == ref_key[:3]:  # the same collective now, parted earlier (checked every N)
            parts.append(f"{_ranks(ranks)} issued a different sequence of collectives before #{rows[ranks[0]][0]} "
                         f"than {_ranks(ref)} (running fingerprints differ)")
        else:
            parts.append(f"{_ranks(ranks)} issued {describe(*key[:3])} as #{rows[ranks[0]][0]} where "
                         f"{_ranks(ref)} issued {describe(*ref_key[:3])}")
    return "; ".join(parts)


def first_divergence(rings: list[list[tuple[int, int, int, int]]]) -> str | None:
    """Where the kept records of the ranks first differ, as one line per differing rank."""
    by_seq = [{r[0]: r[1:] for r in ring} for ring in rings]
    common = sorted(set.intersection(*(set(s) for s in by_seq)))
    for seq in common:
        rows = [[seq, *s[seq], 0] for s in by_seq]
        if (text := mismatch_message(rows)) is not None:
            return text
    return None


class OrderCheck:
    """The running fingerprint of one group's collectives, compared across its ranks."""

    def __init__(self, group: dist.ProcessGroup, rank: int, world_size: int, every: int = 1) -> None:
        self.group = group
        self.rank = rank
        self.world_size = world_size
        self.every = max(1, every)
        self.fingerprint = 0
        self.ring: deque[tuple[int, int, int, int]] = deque(maxlen=RING)
        # host tensors: the check's group always serves the CPU (a gloo twin on NCCL)
        self._mine = torch.zeros(5, dtype=torch.int64, device="cpu")
        self._all = torch.zeros(5 * world_size, dtype=torch.int64, device="cpu")

    def issue(self, seq: int, kind: str, numel: int, dtype: str) -> None:
        """Fold collective ``seq`` into the fingerprint; compare with every rank when it is due."""
        k, d = _code(kind, KINDS), _code(dtype, DTYPES)
        self.fingerprint = ((self.fingerprint * _PRIME) ^ (k << 56 ^ d << 48 ^ numel)) & _MASK
        self.ring.append((seq, k, numel, d))
        if seq % self.every:
            return
        self._mine.copy_(torch.tensor([seq, k, numel, d, self.fingerprint], device="cpu"))
        _ALL_GATHER(self._all, self._mine, group=self.group)
        rows = self._all.view(self.world_size, 5).tolist()
        if len({tuple(r[1:]) for r in rows}) == 1:
            return
        text = mismatch_message(rows) or "the ranks' collectives differ"
        if self.every > 1:  # name the first collective where the kept records part
            rings: list[list[tuple[int, int, int, int]]] = [[] for _ in range(self.world_size)]
            dist.all_gather_object(rings, list(self.ring), group=self.group)
            text = first_divergence(rings) or text
        raise CollectiveOrderError(f"[rank {self.rank}] collective order differs between ranks: {text}",
                                   "every rank must issue the same collectives in the same order: look for a "
                                   "branch on rank-dependent data (a skipped backward, a model built in another "
                                   "order) before that point")


def check_every(env: Mapping[str, str] = os.environ) -> int:
    text = env.get(EVERY_ENV, "1").strip()
    if not text.isdigit() or int(text) < 1:
        raise EngineError(f"{EVERY_ENV}={text!r} is not a positive count",
                          "give how many collectives pass between two checks (1: before every one)")
    return int(text)


def order_check_for(group: dist.ProcessGroup, rank: int, world_size: int, serves_cpu: bool) -> OrderCheck:
    """The check of ``group``: on the group itself when it serves the CPU, else on a gloo twin of it.

    A twin is made with ``dist.new_group``, which every rank of the default group calls at
    the same point: each rank builds its engine's collectives at the same point.
    """
    check_group = group if serves_cpu else dist.new_group(dist.get_process_group_ranks(group), backend="gloo")
    return OrderCheck(check_group, rank, world_size, check_every())
