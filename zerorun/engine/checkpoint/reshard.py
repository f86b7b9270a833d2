"""Resharding as pure arithmetic: which saved chunks fill which owned ranges.

A saved chunk (rank ``r`` of ``N``) and an owned range of the loading rank are both
cut into *pieces*: maximal runs of one parameter's elements (padding belongs to no
parameter and is skipped). Matching pieces by parameter name and element range gives
the copies to make, and so the rank files this rank must read. Bucket boundaries,
padding, world size and stage may all differ between saving and loading; only the
parameter names and shapes must agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from zerorun.engine.checkpoint.manifest import BucketEntry


@dataclass(frozen=True)
class Piece:
    """``length`` elements of parameter ``name`` from element ``start``, at ``pos`` of a bucket's chunk."""

    bucket: int
    pos: int
    name: str
    start: int
    length: int


@dataclass(frozen=True)
class Copy:
    """Copy ``length`` elements from a saved rank's bucket chunk to this rank's owned bucket range."""

    src_rank: int
    src_bucket: int
    src_pos: int
    dst_bucket: int
    dst_pos: int
    length: int


def chunk_pieces(buckets: Sequence[BucketEntry], parts: int, index: int) -> list[Piece]:
    """The pieces of chunk ``index`` of ``parts`` equal chunks of every bucket (parts=1: whole buckets)."""
    pieces: list[Piece] = []
    for bi, bucket in enumerate(buckets):
        size = bucket.padded_numel // parts
        lo, hi = index * size, (index + 1) * size
        for p in bucket.params:
            a, b = max(lo, p.offset), min(hi, p.offset + p.numel)
            if a < b:
                pieces.append(Piece(bi, a - lo, p.name, a - p.offset, b - a))
    return pieces


def plan_copies(saved: Sequence[BucketEntry], saved_world: int, owned: list[Piece]) -> list[Copy]:
    """Every copy that fills the ``owned`` pieces from the chunks of a checkpoint saved at ``saved_world``."""
    by_name: dict[str, list[tuple[int, Piece]]] = {}
    for rank in range(saved_world):
        for piece in chunk_pieces(saved, saved_world, rank):
            by_name.setdefault(piece.name, []).append((rank, piece))
    copies: list[Copy] = []
    for want in owned:
        for rank, have in by_name.get(want.name, []):
            a = max(want.start, have.start)
            b = min(want.start + want.length, have.start + have.length)
            if a < b:
                copies.append(Copy(rank, have.bucket, have.pos + a - have.start,
                                   want.bucket, want.pos + a - want.start, b - a))
    return copies


def ranks_to_read(copies: list[Copy]) -> list[int]:
    return sorted({c.src_rank for c in copies})
