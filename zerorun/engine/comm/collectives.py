"""The only caller of torch.distributed collectives in the engine.

Every collective takes its process group as an argument, can run asynchronously
(returning a :class:`Pending` handle), and is counted per kind: calls, bytes and
elements, so tests, the benchmark, ``estimate`` and ``autotune`` read the same figures.

Counting convention (the one ZeRO's arithmetic uses): ``elements`` is the size of the
full buffer the collective operates on - the input of an all-reduce or a
reduce-scatter, the output of an all-gather. So per step a data-parallel all-reduce of
Psi elements counts Psi on the ``all_reduce`` row (2 Psi in reduce-scatter + all-gather
terms), and ZeRO-1/2 count Psi reduce-scatter + Psi all-gather.

gloo has no native reduce-scatter (torch emulates ``reduce_scatter_tensor`` with an
all-reduce of the whole input) and its all-gather is slow, so on gloo both run as
direct point-to-point exchanges: for a reduce-scatter each rank sends every peer that
peer's chunk and adds the N-1 chunks it receives into its own; for an all-gather it
sends its chunk to every peer and receives theirs in place. Each rank sends (N-1)/N of
the buffer, half of what an all-reduce moves (measured on 2 gloo ranks, 100 MB:
reduce-scatter 45 ms, all-gather 35-42 ms, against 60 ms for the all-reduce that
carried each before). When every rank runs on one host, the engine opens a faster lane
(:meth:`Collectives.open_shared_lane`, :mod:`zerorun.engine.comm.shm`): reduce-scatters,
all-gathers and sum all-reduces go through shared memory in slot-sized pieces, one copy in
and one read out, no kernel in between. :meth:`CommCounter.snapshot` says which path
carries each kind (``via``); the counted figures stay the logical collectives. On NCCL
reduce-scatter and all-gather are native and the lane is never opened.
Which one runs is decided from the group's device->backend map (see
:mod:`zerorun.engine.comm.bootstrap`), not from the backend's name.

Every tensor a collective sees lives on the group's device (:attr:`Collectives.device`):
a blocking collective on a tensor elsewhere (a host scalar, an offloaded shard) is run
on a device copy that is copied back, so NCCL never sees a CPU tensor; an asynchronous
one is refused, since the copy back would have to wait anyway.

Tests turn on checking modes with ``ZERORUN_CHECK_COLLECTIVES`` (deferred work, device
discipline, the NCCL policy on gloo: :mod:`zerorun.engine.comm.checks`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import suppress
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from zerorun import torch_compat
from zerorun.engine.comm import shm, trace
from zerorun.engine.comm.backward_tls import outside_backward_tls
from zerorun.engine.comm.bootstrap import group_backends, native_scatter, serving
from zerorun.engine.comm.checks import check_device, check_modes, defer
from zerorun.engine.comm.counter import CommCounter
from zerorun.engine.comm.order_check import OrderCheck, order_check_for
from zerorun.engine.comm.shm import SharedLane
from zerorun.engine.comm.sums import land, sum_chunks
from zerorun.engine.comm.work import Exchange, LaneWork, Pending

_T = TypeVar("_T")  # all_gather_object: every rank's object, of the caller's type

# A collective is one opaque call to torch.compile (one graph break at its call site, in a
# stage-3 gather): traced into, its thread-local check and async work break the graph twice.
# torch's lazy form of torch.compiler.disable: the same break, but torch._dynamo (2-3x torch's
# own import) is imported at the first call, not by importing this module (`zerorun convert`
# reaches it through the checkpoint readers and never calls a collective)
_opaque_to_compile = torch_compat.disable_compile

# torch 2.13 deprecates the *_tensor names (a FutureWarning per call site) for the *_single
# ones, same arguments; older torch has only the former
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_REDUCE_SCATTER = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


def group_timeout_s(group: dist.ProcessGroup | None, device: torch.device) -> float:
    """The collective timeout ``group`` was created with (``init_process_group(timeout=...)``),
    so a lane wait gives up when the backend's own collectives would."""
    with suppress(AttributeError, RuntimeError):  # a backend without options: torch's default
        if group is not None:
            return torch_compat.group_timeout_s(group, device)
    return shm.WAIT_TIMEOUT_S


class Collectives:
    """Counted collectives over one process group (``group=None`` with world size 1: no-ops)."""

    def __init__(self, group: dist.ProcessGroup | None, world_size: int, rank: int, *,
                 live_at_one: bool = False, order_check: bool = True) -> None:
        """``live_at_one``: issue the collectives even at world size 1 (the one-GPU check: NCCL's
        kernels then run, where the engine would skip them). ``order_check``: False for a subgroup
        (hpZ, MiCS): the check's gloo twin would be a ``new_group`` only the subgroup's ranks call."""
        self.group = group
        self.world_size = world_size
        self.rank = rank
        self.counter = CommCounter()
        self.checks = check_modes()  # the test stand-ins for a GPU (zerorun.engine.comm.checks)
        self.live_at_one = (live_at_one or "live" in self.checks) and group is not None
        # torch's point-to-point and broadcast name peers by their world rank: a subgroup's (hpZ, MiCS) differ
        self._world_ranks = (list(range(world_size)) if group is None or group is dist.group.WORLD
                             else [dist.get_global_rank(group, r) for r in range(world_size)])
        backend, self.device = "none", torch.device("cpu")
        if group is not None:
            device_type, backend = serving(group_backends(group), torch.cuda.is_available())
            self.device = (torch.device("cuda", torch.cuda.current_device()) if device_type == "cuda"
                           else torch.device(device_type))
        self.native_reduce_scatter = native_scatter(backend) or "native" in self.checks
        # torch's fake group (zerorun.simulate): shapes and bytes are real, reduced values are not
        self.simulated = backend == "fake"
        self.lane: SharedLane | None = None
        self.order: OrderCheck | None = None  # ZERORUN_CHECK_COLLECTIVES=order (comm.order_check)
        if "order" in self.checks and order_check and group is not None and world_size > 1 and not self.simulated:
            self.order = order_check_for(group, rank, world_size, "cpu" in group_backends(group))
        if not self.native_reduce_scatter:
            self.counter.via["reduce_scatter"] = "point-to-point chunk exchange (gloo has no native reduce-scatter)"
            self.counter.via["all_gather"] = "point-to-point chunk exchange (faster than gloo's all-gather)"

    def _live(self) -> bool:
        return self.group is not None and (self.world_size > 1 or self.live_at_one)

    def _issue(self, kind: str, numel: int, dtype: torch.dtype, label: str | None = None) -> tuple[trace.Record, float]:
        """Number a collective for the heartbeat and, in the order check, compare it across ranks
        first; the time from here to its completion is time blocked (the check's exchange too)."""
        start = time.perf_counter()
        record = trace.issue(kind, numel, dtype, label)
        if self.order is not None:
            self.order.issue(*record)
        return record, start

    @_opaque_to_compile
    def all_reduce(self, tensor: torch.Tensor, *, async_op: bool = False,
                   op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> Pending:
        """Sum (or ``op``) ``tensor`` in place across ranks."""
        self.counter.add("all_reduce", tensor)
        if not self._live():
            return Pending(None)
        record, start = self._issue("all_reduce", tensor.numel(), tensor.dtype)
        if async_op and "deferred" in self.checks:
            return Pending(defer("all_reduce", tensor, lambda t: self._all_reduce(t, True, op))).traced(record, start)
        return self._all_reduce(tensor, async_op, op).traced(record, start)

    def _all_reduce(self, tensor: torch.Tensor, async_op: bool, op: dist.ReduceOp.RedOpType) -> Pending:
        if op == dist.ReduceOp.SUM and (lane := self._lane_for(tensor)) is not None:
            return self._lane_pending(lane, lane.all_reduce(tensor), async_op)
        return self._run(tensor, async_op, lambda t: dist.all_reduce(t, op=op, group=self.group,
                                                                      async_op=async_op))

    def all_true(self, ok: bool) -> bool:
        """Whether ``ok`` holds on every rank (one MIN all-reduce of a flag on the device).

        A control message, not model state: it is not counted, so the per-step figures
        stay the ZeRO arithmetic.
        """
        if not self._live():
            return ok
        assert not self.simulated, "a simulated world (fake group) leaves a reduced flag undefined: decide without it"
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32, device=self.device)
        self._check_device("all_true", flag)
        record, start = self._issue("all_true", 1, torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        Pending(None).traced(record, start)
        return bool(flag.item())

    def _run(self, tensor: torch.Tensor, async_op: bool,
             fn: Callable[[torch.Tensor], dist.Work | None]) -> Pending:
        """Run ``fn`` (an in-place collective) on ``tensor``, or on a device copy of it copied back."""
        if tensor.is_meta:  # a simulated world's storage-less tensor: no data moves (and torch 2.6.0 has no
            return Pending(None)  # Meta kernel for c10d's ops to say so)
        if tensor.device.type == self.device.type:
            self._check_device("a collective", tensor)
            with outside_backward_tls():
                work = fn(tensor)
            return Pending(work if async_op else None)
        if async_op:
            raise AssertionError(f"an asynchronous collective got a {tensor.device} tensor, "
                                 f"but the group's device is {self.device}")
        staged = self._device_copy(tensor)
        self._check_device("a collective", staged)
        fn(staged)
        tensor.copy_(staged)
        return Pending(None)

    def _device_copy(self, tensor: torch.Tensor) -> torch.Tensor:
        return tensor.to(self.device)

    def _check_device(self, kind: str, *tensors: torch.Tensor) -> None:
        if "device" in self.checks:
            check_device(kind, self.device, list(tensors))

    @_opaque_to_compile
    def reduce_scatter(self, flat: torch.Tensor, *, out: torch.Tensor | None = None, scale: float = 1.0,
                       async_op: bool = False) -> Pending:
        """Sum ``flat`` across ranks; afterwards this rank's chunk ``shard_of(flat)`` holds the sum.

        ``flat.numel()`` must be a multiple of the world size. Other chunks of ``flat``
        are left undefined (they hold partial or full sums depending on the backend).
        ``out`` (a chunk-sized tensor of ``flat``'s dtype, apart from ``flat``): the sum times
        ``scale`` lands there instead, written by the collective itself where the path can
        (NCCL's output, the shared-memory lane's adds, scaled piece by piece while in cache), so
        a caller that keeps the sum elsewhere saves a pass or two; every chunk of ``flat`` is
        undefined then.
        """
        assert out is not None or scale == 1.0, "a scaled reduce-scatter lands in out"
        self.counter.add("reduce_scatter", flat)
        if not self._live():
            if out is not None:
                land(out, self.shard_of(flat), scale)
            return Pending(None)
        record, start = self._issue("reduce_scatter", flat.numel(), flat.dtype)
        if async_op and "deferred" in self.checks:
            pending = Pending(defer("reduce_scatter", flat, lambda t: self._reduce_scatter(t, True)))
            return self._landed_out(pending, flat, out, scale, True).traced(record, start)
        return self._reduce_scatter(flat, async_op, out, scale).traced(record, start)

    def _reduce_scatter(self, flat: torch.Tensor, async_op: bool, out: torch.Tensor | None = None,
                        scale: float = 1.0) -> Pending:
        if self.native_reduce_scatter:
            if out is not None and flat.device.type == self.device.type:  # no staged copy between: NCCL's output
                pending = self._run(flat, async_op, lambda t: _REDUCE_SCATTER(
                    out, t, group=self.group, async_op=async_op))
                return self._landed_out(pending, out, out, scale, async_op)
            pending = self._run(flat, async_op, lambda t: _REDUCE_SCATTER(
                self.shard_of(t), t, group=self.group, async_op=async_op))
            return self._landed_out(pending, flat, out, scale, async_op)
        if (lane := self._lane_for(flat)) is not None:
            return self._lane_pending(lane, lane.reduce_scatter(flat, out, scale), async_op)
        size = flat.numel() // self.world_size
        received = [torch.empty(size, dtype=flat.dtype, device=flat.device) for _ in self._peers()]
        ops = []
        for peer, buf in zip(self._peers(), received, strict=True):
            ops += [dist.P2POp(dist.isend, flat.narrow(0, peer * size, size), self._world_ranks[peer], self.group),
                    dist.P2POp(dist.irecv, buf, self._world_ranks[peer], self.group)]
        mine = self.shard_of(flat)
        target = mine if out is None else out
        return self._exchange(ops, lambda: sum_chunks(target, mine, received, scale), async_op)

    def _landed_out(self, pending: Pending, summed: torch.Tensor, out: torch.Tensor | None, scale: float,
                    async_op: bool) -> Pending:
        """A reduce-scatter that left its sum in ``summed``'s chunk (or in ``out`` itself): the sum
        times ``scale`` in ``out`` (if any) once complete."""
        if out is None:
            return pending
        source = out if summed is out else self.shard_of(summed)
        if not async_op:  # complete already
            land(out, source, scale)
            return pending
        return pending.then(lambda: land(out, source, scale))

    @_opaque_to_compile
    def all_gather(self, flat: torch.Tensor, *, async_op: bool = False, label: str | None = None) -> Pending:
        """Fill every chunk of ``flat`` from its owner rank; this rank's chunk is the input (in place).

        ``label``: what the gather is for (a stage-3 unit's name), shown in a stall verdict."""
        self.counter.add("all_gather", flat)
        if not self._live():
            return Pending(None)
        record, start = self._issue("all_gather", flat.numel(), flat.dtype, label)
        if async_op and "deferred" in self.checks:
            return Pending(defer("all_gather", flat, lambda t: self._all_gather(t, True))).traced(record, start)
        return self._all_gather(flat, async_op).traced(record, start)

    def _all_gather(self, flat: torch.Tensor, async_op: bool) -> Pending:
        if self.native_reduce_scatter:
            return self._run(flat, async_op, lambda t: _ALL_GATHER(
                t, self.shard_of(t), group=self.group, async_op=async_op))
        if (lane := self._lane_for(flat)) is not None:
            return self._lane_pending(lane, lane.all_gather(flat), async_op)
        size = flat.numel() // self.world_size
        ops = []
        for peer in self._peers():
            ops += [dist.P2POp(dist.isend, self.shard_of(flat), self._world_ranks[peer], self.group),
                    dist.P2POp(dist.irecv, flat.narrow(0, peer * size, size), self._world_ranks[peer], self.group)]
        return self._exchange(ops, None, async_op)

    @_opaque_to_compile
    def all_to_all(self, send: torch.Tensor, recv: torch.Tensor, *, counted_as: str,
                   finish: Callable[[], None] | None = None, async_op: bool = False) -> Pending:
        """Chunk p of ``send`` goes to rank p, into chunk ``rank`` of ``recv`` (equal chunks, same dtype);
        ``finish`` runs once all arrived. Counted under ``counted_as`` (qgZ's exchange is the gradient
        reduce-scatter: :mod:`zerorun.engine.comm.quantized`); point to point on gloo, never the lane."""
        self.counter.add(counted_as, send)
        size = send.numel() // self.world_size
        recv.narrow(0, self.rank * size, size).copy_(self.shard_of(send))  # nothing crosses a link for its own
        if not self._live():
            return self._exchange([], finish, async_op)
        record, start = self._issue(counted_as, send.numel(), send.dtype)
        if send.is_meta:  # simulated (see _run)
            return self._exchange([], finish, async_op).traced(record, start)
        if self.native_reduce_scatter:
            self._check_device("all_to_all", send, recv)
            with outside_backward_tls():
                work = dist.all_to_all_single(recv, send, group=self.group, async_op=True)
            exchange = Exchange([work], finish)
            if not async_op:
                exchange.wait()
            return Pending(exchange if async_op else None).traced(record, start)
        self.counter.via[counted_as] = "point-to-point all-to-all (quantized, zerorun.engine.comm.quantized)"
        ops = []
        for peer in self._peers():
            to = self._world_ranks[peer]
            ops += [dist.P2POp(dist.isend, send.narrow(0, peer * size, size), to, self.group),
                    dist.P2POp(dist.irecv, recv.narrow(0, peer * size, size), to, self.group)]
        return self._exchange(ops, finish, async_op).traced(record, start)

    def all_gather_object(self, obj: _T) -> list[_T]:
        """Every rank's ``obj`` (picklable), in rank order; uncounted (set-up and figures, not training)."""
        if not self._live():
            return [obj]
        out: list[Any] = [None] * self.world_size
        record, start = self._issue("all_gather_object", 0, torch.uint8)
        dist.all_gather_object(out, obj, group=self.group)
        Pending(None).traced(record, start)
        return out

    # ---- the same-host shared-memory lane (gloo only) ---------------------------------------------
    def open_shared_lane(self, largest_numel: int) -> bool:
        """Carry this group's reduce-scatters, all-gathers and sum all-reduces through shared memory,
        when every rank runs on this host (see :mod:`~zerorun.engine.comm.shm`); a slot holds
        ``largest_numel`` fp32 elements (the largest bucket) or less: the lane's budget over the
        world (a larger collective goes in pieces).

        Every rank must call it, with the same ``largest_numel``; whether the lane opened is
        agreed by all (any rank that cannot map the segments makes all use gloo).
        """
        slot_bytes = shm.slot_bytes_for(4 * largest_numel, self.world_size)
        if (self.lane is not None or self.native_reduce_scatter or not self._live() or self.device.type != "cpu"
                or self.world_size < 2):
            return self.lane is not None
        offer = (shm.lane_supported(), shm.host_identity(), shm.new_token())
        offers = self.all_gather_object(offer)
        if not all(o[0] for o in offers) or len({o[1] for o in offers}) != 1:
            return False
        token = offers[0][2]
        own: torch.Tensor | None = None
        segments: list[torch.Tensor] = []
        try:
            with suppress(OSError, RuntimeError):  # a full /dev/shm, a name that exists, torch refusing the mapping
                own = shm.create_segment(token, self.rank, slot_bytes)
            if self.all_true(own is not None):
                try:
                    segments = [own if r == self.rank else shm.open_segment(token, r, slot_bytes)
                                for r in range(self.world_size)]
                except (OSError, RuntimeError):
                    segments = []
            opened = self.all_true(bool(segments))  # every rank has mapped every segment (or given up)
        finally:  # also when a peer dies in all_true: the name goes, the mapping lives on while needed
            if own is not None:  # only a name this rank created: an existing one is someone else's
                shm.segment_path(token, self.rank).unlink(missing_ok=True)
        if opened:
            self.lane = SharedLane(segments, self.rank, slot_bytes, group_timeout_s(self.group, self.device))
            self.counter.via["reduce_scatter"] = self.counter.via["all_gather"] = self.counter.via["all_reduce"] = (
                "shared memory between the ranks of this host")
        return opened

    def _lane_for(self, tensor: torch.Tensor) -> SharedLane | None:
        """The lane, when ``tensor`` goes through it (a host tensor that fits a slot)."""
        lane = self.lane
        return lane if lane is not None and tensor.device.type == "cpu" and lane.fits(tensor) else None

    def _lane_pending(self, lane: SharedLane, seq: int, async_op: bool) -> Pending:
        work = LaneWork(lane, seq)
        if async_op:
            return Pending(work)
        work.wait()
        return Pending(None)

    def _peers(self) -> list[int]:
        return [r for r in range(self.world_size) if r != self.rank]

    def _exchange(self, ops: list[dist.P2POp], finish: Callable[[], None] | None, async_op: bool) -> Pending:
        """Start the point-to-point ``ops`` (every rank issues its collectives in the same order, so
        sends and receives pair up); ``finish`` runs when they are complete."""
        if not ops:  # no peer (world size 1, issued by `live_at_one`): nothing to exchange
            if finish is not None:
                finish()
            return Pending(None)
        self._check_device("a point-to-point exchange", *(op.tensor for op in ops))
        with outside_backward_tls():
            exchange = Exchange(dist.batch_isend_irecv(ops), finish)
        if async_op:
            return Pending(exchange)
        exchange.wait()
        return Pending(None)

    @_opaque_to_compile
    def broadcast(self, tensor: torch.Tensor, src: int) -> None:
        self.counter.add("broadcast", tensor)
        if self._live():
            record, start = self._issue("broadcast", tensor.numel(), tensor.dtype)
            self._run(tensor, False, lambda t: dist.broadcast(t, src=self._world_ranks[src],
                                                                        group=self.group)).traced(record, start)

    def shard_of(self, flat: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous chunk of a flat buffer padded to a multiple of the world size."""
        size = flat.numel() // self.world_size
        return flat.narrow(0, self.rank * size, size)
