"""The same-host shared-memory lane's footprint: what gloo ranks of one host map for it.

The engine's lane (:mod:`zerorun.engine.comm.shm`) sizes its slots from a budget over
the world, so every rank maps at most about ``LANE_BYTES`` of it (its own segment and the
parts of its peers' it reads), whatever the buckets. Those pages are resident, so the
estimate of a CPU run that used the lane counts them; the physical *floor* does not (it is
the transport-free minimum, as NCCL's own buffers are outside the CUDA allocator's count).
The constants mirror the engine's, so this needs no torch; a test holds the two equal.
"""

from __future__ import annotations

LANE_BYTES = 8 * 2**20
SLOTS = 4
MIN_SLOT_BYTES = 64 * 2**10
HEADER_BYTES = 192


def lane_slot_bytes(largest_bytes: int, world_size: int) -> int:
    """One slot's bytes for collectives of up to ``largest_bytes`` (the engine's ``slot_bytes_for``)."""
    budget = max(MIN_SLOT_BYTES, LANE_BYTES // (SLOTS * world_size))
    size = max(min(largest_bytes, budget), 8 * world_size)
    return -(-size // 64) * 64


def lane_bytes(largest_bytes: int, world_size: int) -> int:
    """Bytes of lane one rank maps at most: every rank's segment (header and slots)."""
    if world_size < 2:
        return 0
    return world_size * (HEADER_BYTES + SLOTS * lane_slot_bytes(largest_bytes, world_size))
