"""The GPU check's second set: what world-1 NCCL, a busy stream, NVMe pinning and set-up can show.

Imported by bench/gpu_check.py. On the CPU (the dry mode) every check runs the same code on
gloo with tiny sizes; the figures only a GPU has are ``None`` and the bounds are reported,
not enforced.

* :func:`live_collectives`: ``ZERORUN_CHECK_COLLECTIVES=live`` for the body: the engine issues
  every collective at world 1 (async works, their waits, buffers freed after them, the
  overlapped all-gather of ``MasterShards.step``, the staging pool's reuse) on the real
  backend and device of the bootstrap, not gloo's policy.
* :func:`stressed`: before every wait of a collective and every queued host<->device copy,
  ``torch.cuda._sleep`` keeps the current (compute) stream busy, so work that the host does not
  wait for is still queued when the host moves on (FSDP's delay injection, on the stream).
* :func:`pinned_host_bytes`: torch's caching host allocator's reserved bytes (what it keeps).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

from zerorun.engine.comm import work as work_mod
from zerorun.engine.comm.checks import CHECK_ENV
from zerorun.engine.offload import copies as copies_mod

SLEEP_CYCLES = 2_000_000  # ~1 ms at 2 GHz: longer than any world-1 collective or small copy


@contextlib.contextmanager
def live_collectives() -> Iterator[None]:
    saved = os.environ.get(CHECK_ENV)
    os.environ[CHECK_ENV] = ",".join(filter(None, [saved, "live"]))
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop(CHECK_ENV, None)
        else:
            os.environ[CHECK_ENV] = saved


@contextlib.contextmanager
def stressed(cycles: int = SLEEP_CYCLES) -> Iterator[dict[str, int]]:
    """Busy the current stream before each collective wait and each queued copy (CUDA only)."""
    counts = {"waits": 0, "copies": 0}
    if not torch.cuda.is_available():
        yield counts
        return
    wait, issue = work_mod.Pending.wait, copies_mod.Transfers._issue

    def slow_wait(self: work_mod.Pending) -> None:
        if not self.done:
            torch.cuda._sleep(cycles)
            counts["waits"] += 1
        wait(self)

    def slow_issue(self: copies_mod.Transfers, dst: torch.Tensor, src: torch.Tensor) -> None:
        torch.cuda._sleep(cycles)
        counts["copies"] += 1
        issue(self, dst, src)

    work_mod.Pending.wait, copies_mod.Transfers._issue = slow_wait, slow_issue  # type: ignore[method-assign]
    try:
        yield counts
    finally:
        work_mod.Pending.wait, copies_mod.Transfers._issue = wait, issue  # type: ignore[method-assign]


def pinned_host_bytes() -> int | None:
    """Pinned host memory torch's caching host allocator holds (None: no CUDA, or a torch without it)."""
    stats = getattr(torch.cuda, "host_memory_stats", None)
    if not torch.cuda.is_available() or stats is None:
        return None
    s = stats()
    return int(s.get("reserved_bytes.current", s.get("allocated_bytes.all.current", 0)))


def pow2(n: int) -> int:
    """What torch's caching host allocator reserves for a block of ``n`` bytes (a power of two)."""
    return 1 << max(0, n - 1).bit_length()


def nvme_pinned_bound(engine: Any) -> int:
    """What NVMe offload (parameters and optimizer, pinned) may keep pinned after N steps: the staging
    ring (2 slots of the largest parameter shard) and the gradient shards copied down for the step
    (fp32, all buckets at once). Not the masters, not the parameter shards: those rest in files."""
    buckets = engine.parts.buckets
    shard_bytes = [b.shard_numel * b._placeholder.element_size() for b in [*buckets, *engine.parts.frozen]]
    ring = 2 * pow2(max(shard_bytes, default=0))
    grads = sum(pow2(4 * b.shard_numel) for b in buckets)
    return ring + grads


def setup_bound(engine: Any, after: int) -> dict[str, int]:
    """Stages 0-2's set-up bound: the model in the compute dtype + one fp32 bucket + the masters that
    live on the device, or what the stage holds after set-up (``after``), whichever is larger."""
    psi = engine.num_parameters()
    itemsize = engine.parts.buckets[0].data.element_size()
    largest = max(b.plan.padded_numel for b in engine.parts.buckets)
    masters = engine.parts.masters.masters
    device_masters = sum(m.numel() * 4 for m in masters if m.device.type == "cuda" and m.dtype == torch.float32
                         and not engine.parts.masters.alias)
    transient = itemsize * psi + 4 * largest + device_masters
    return {"psi": psi, "compute_bytes": itemsize * psi, "fp32_bucket": 4 * largest, "device_masters": device_masters,
            "transient": transient, "after": after, "bound": max(transient, after)}
