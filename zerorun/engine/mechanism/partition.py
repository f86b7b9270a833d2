"""Stage 3's parameter storage: a :class:`FlatBucket` whose full buffer exists only while gathered.

A bucket holds the parameters of one module unit. ``local`` (this rank's chunk, in the
compute dtype) is the only copy held while the bucket is :attr:`ParamState.SHARDED`;
the parameters then point at an empty placeholder. Gathering gives the bucket's full
padded buffer its bytes back, writes ``local`` into this rank's chunk, all-gathers (the
same :meth:`Collectives.all_gather` as stages 1-2) and re-binds the parameters as views
of the buffer; releasing re-points the parameters at the placeholder and frees the
buffer's bytes *in place* (its storage is resized to 0, FSDP2's way).

Why in place: autograd saves views of the gathered weights for backward (``F.linear``
saves ``weight.t()``). Dropping our reference to the buffer would leave those views
holding every released unit alive until its backward ran (measured: stage 3 held about
what stage 1 holds). Freeing the one storage they share releases the bytes whoever
holds a view, and the re-gather before the unit's backward writes the same storage
again, so each saved view reads valid values when autograd uses it. The rule that makes
this safe lives in :mod:`zerorun.engine.mechanism.gather`: a unit is released after forward only
when a hook will gather it again before its backward.
The refill is no in-place edit in autograd's eyes, with nothing to undo: a parameter bound
with ``p.data = view`` keeps its own version counter (``.data`` assignment swaps the
storage, not the counter), and what autograd saves (``p``, or a view of ``p`` such as
``weight.t()``) shares that counter, never the buffer's, which the refill's writes bump
(tests/engine/test_engine_stage3_units.py shows both).
With fp32 compute ``local`` is also the fp32 master the optimizer steps (an alias).
With parameter offload (``offload``, :mod:`zerorun.engine.offload.params`) ``local`` rests
in host memory or a swap file and is fetched to the compute device for each gather.

Each partitioned parameter carries ``param.zr_bucket`` (its bucket), which is how
``zero.GatheredParameters`` and the engine find it; it is a guarded
:class:`~zerorun.engine.mechanism.guard.ZeroParameter` exactly while the bucket is not
gathered. ``toucher`` (set by the gather coordinator) is asked to gather the bucket when
a guarded parameter is used; ``frozen`` buckets hold parameters the optimizer does not
step (no master, no gradient reduction).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import nn

from zerorun import torch_compat
from zerorun.engine.comm.collectives import Collectives, Pending
from zerorun.engine.comm.quantize import pack, packed_bytes
from zerorun.engine.comm.quantized import quantized_all_gather
from zerorun.engine.mechanism.buckets import ALIGN_ELEMENTS, BucketPlan, FlatBucket, plan_buckets
from zerorun.engine.mechanism.buffer_pool import BufferPool
from zerorun.engine.mechanism.guard import guard, unguard
from zerorun.engine.mechanism.param_state import BUCKET_ATTR, ParamState, check_transition
from zerorun.engine.mechanism.placement import to_device
from zerorun.engine.mechanism.routes import GatherRoutes
from zerorun.engine.surface import ds_param_attrs

if TYPE_CHECKING:
    from zerorun.engine.mechanism.shard_store import ShardStore

def bucket_of(param: torch.Tensor) -> PartitionedBucket | None:
    return getattr(param, BUCKET_ATTR, None)


def unit_bucket(params: list[nn.Parameter], coll: Collectives, name: str, group_index: int = 0,
                device: torch.device | None = None) -> PartitionedBucket:
    """One bucket for all of ``params`` (a module unit is never split), laid out by :func:`plan_buckets`.

    With ``device``, the unit's parameters are moved there first (one counted move per
    unit, :func:`~zerorun.engine.mechanism.placement.to_device`), so the bucket is built on the
    engine's device and only this unit is ever whole there.
    """
    if device is not None:
        moved = to_device([p.data for p in params], device)
        for p, t in zip(params, moved, strict=True):
            p.data = t
    shapes = [p.shape for p in params]
    # aligned as stages 0-2 lay out (16 bytes in bf16): every parameter view and every rank's chunk
    # starts where vectorised kernels and NCCL's fast paths want it; the bound leaves room for the padding
    bound = sum(-(-s.numel() // ALIGN_ELEMENTS) * ALIGN_ELEMENTS for s in shapes)
    plans = plan_buckets(shapes, max(1, bound), coll.world_size, group_index, align=ALIGN_ELEMENTS)
    assert len(plans) == 1
    return PartitionedBucket(plans[0], [params[i] for i in plans[0].param_indices], coll, name)


class PartitionedBucket(FlatBucket):
    def __init__(self, plan: BucketPlan, params: list[nn.Parameter], coll: Collectives, name: str) -> None:
        """``params`` in the plan's slot order; they become views of the (gathered) buffer."""
        super().__init__(plan, params, coll.world_size, coll.rank)  # gathered: full buffer, params bound
        self.coll = coll
        self.name = name
        self.state = ParamState.GATHERED
        self.persistent = False
        self.provisional = False  # made by zero.Init; replaced by the engine's buckets at initialize
        self.frozen = False  # parameters the optimizer does not step: no master, no gradient reduction
        self.toucher: Callable[[PartitionedBucket], bool] | None = None
        # asked to keep the bucket gathered when a ``GatheredParameters`` ends inside forward/backward
        self.holder: Callable[[PartitionedBucket], bool] | None = None
        self.local: torch.Tensor | None = None
        self.master: torch.Tensor | None = None  # the fp32 master when it is not ``local`` itself
        self._pending: Pending | None = None
        self.offload: ShardStore | None = None  # a ParamOffload holding the resting shard (offload_param), else None
        # ZeRO++ (zerorun.engine.comm.quantized): the coordinator's gathers travel as int8 blocks (qwZ), and a
        # frozen bucket may rest as them (``local`` None): every gather then dequantizes what rests
        self.quantized_gather = False
        self.resting: torch.Tensor | None = None
        self.routes = GatherRoutes()  # hpZ's secondary group, MiCS's two hops (zerorun.engine.mechanism.routes)
        self.pool: BufferPool | None = None  # host buffers released within a pass, kept for the next gather
        self._placeholder = torch.empty(0, dtype=self.data.dtype, device=self.data.device)
        self._full = self.data  # the one full buffer (a fresh tensor, its storage's whole); bytes only while not sharded
        for p in params:
            setattr(p, BUCKET_ATTR, self)
        ds_param_attrs.sync(self)

    # ---- set-up -------------------------------------------------------------------------------
    def seal(self) -> None:
        """Take this rank's chunk of the (gathered, rank-consistent) buffer as the persistent shard."""
        self.local = self.shard(self.data).clone()
        ds_param_attrs.sync(self)  # ds_tensor: a view of the new shard

    def cast_(self, dtype: torch.dtype) -> None:
        if self.local is not None and self.local.dtype != dtype:
            self.local = self.local.to(dtype)
        self._placeholder = self._placeholder.to(dtype)
        if self.state is ParamState.GATHERED:
            super().cast_(dtype)  # a new buffer in ``dtype``, the parameters bound to it
            self._full = self.data
        elif self._full.dtype != dtype:
            self._full = torch.empty(self.plan.padded_numel, dtype=dtype, device=self._placeholder.device)
            _free(self._full)
            self.data = self._placeholder
        ds_param_attrs.sync(self)  # ds_tensor views the cast shard

    def bind(self) -> None:
        """Gathered: the parameters become plain views of the buffer (no guard on their ops)."""
        for p in self.params:
            unguard(p)
        super().bind()

    # ---- lifecycle ----------------------------------------------------------------------------
    def _move(self, new: ParamState) -> None:
        check_transition(self.state, new, f"parameter bucket {self.name}")
        self.state = new
        ds_param_attrs.sync_status(self)

    def gather_async(self) -> None:
        """SHARDED -> IN_FLIGHT: give the full buffer its bytes back and start the all-gather (as int8
        blocks under qwZ: :attr:`quantized_gather`, which the coordinator's gathers use)."""
        self._start(self.quantized_gather)

    def _start(self, quantized: bool) -> None:
        """The all-gather; ``quantized``: the chunks travel as int8 blocks. A bucket resting quantized
        always sends them so (:meth:`rest_quantized`)."""
        self._move(ParamState.IN_FLIGHT)
        full = self._full
        if self.pool is None:
            full.untyped_storage().resize_(full.numel() * full.element_size())
        else:
            self.pool.fill(full.untyped_storage(), full.numel() * full.element_size())
        self.data = full
        if self.routes.secondary_held():  # hpZ: from the node's secondary copy, not the primary shards
            self._pending = self.routes.gather_secondary(full, self.name, quantized)
            return
        if self.resting is not None:
            self._pending = quantized_all_gather(self.coll, full, label=self.name, packed=self.resting)
            return
        local = self.local if self.offload is None else self.offload.fetch(self)
        assert local is not None
        if self.offload is None:
            self.shard(full).copy_(local)  # on the device already: a device copy, stream-ordered
        else:
            self.offload.upload(self.shard(full), local)  # host->device, fenced (offload.copies)
        if self.routes.hierarchy is not None:  # MiCS's two hops
            self._pending = self.routes.gather_hierarchical(full, self.name)
            return
        if quantized:
            self._pending = quantized_all_gather(self.coll, full, label=self.name)
            return
        self._pending = self.coll.all_gather(full, async_op=True, label=self.name)  # the name a stall verdict shows

    def wait(self) -> None:
        """IN_FLIGHT -> GATHERED: the buffer is complete; the parameters become views of it."""
        self._move(ParamState.GATHERED)
        assert self._pending is not None
        self._pending.wait()
        self._pending = None
        self.bind()

    def gather(self, exact: bool = False) -> None:
        """Whatever the state, end GATHERED (blocking). ``exact``: never as int8 blocks (``GatheredParameters``
        and checkpoints, as DeepSpeed's are under qwZ), unless the bucket rests quantized."""
        if self.state is ParamState.SHARDED:
            if exact:
                self._start(quantized=False)
            else:
                self.gather_async()
        if self.state is ParamState.IN_FLIGHT:
            self.wait()

    def release(self, keep_views: bool = False, reuse: bool = False) -> None:
        """GATHERED -> SHARDED: the parameters point at an empty placeholder; the full buffer's bytes are freed.

        The bytes go even while autograd holds views of the buffer (see the module doc). ``keep_views``
        (``GatheredParameters``' exit): tensors taken from the gathered parameters (``p.detach().cpu()``
        shares the storage on CPU) keep their bytes, as DeepSpeed's do: when anything still holds the
        storage, the bucket moves to a new one and leaves that one to its holders. ``reuse`` (the
        coordinator's releases within a pass): the bytes go to :attr:`pool`, where there is one, for the
        next gather of this size.
        """
        self._move(ParamState.SHARDED)
        self.routes.keep_secondary(self._full)  # hpZ: the node's shard of what was gathered, until the step
        for p in self.params:
            p.data = self._placeholder
            guard(p)
        self.data = self._placeholder  # dtype and device stay readable; no elements
        if keep_views and _held_elsewhere(self._full):
            self._full = torch.empty_like(self._full)  # never written: on the host no page is touched
        if reuse and self.pool is not None:
            self.pool.keep(self._full.untyped_storage())
        else:
            _free(self._full)

    def read_ahead(self) -> None:
        """About to be gathered (prefetch): start fetching an offloaded resting shard now."""
        if self.offload is not None and self.state is ParamState.SHARDED:
            self.offload.read_ahead(self)

    def rest_quantized(self) -> None:
        """Keep the resting shard as int8 blocks and fp32 scales (``zero_quantized_nontrainable_weights``,
        frozen buckets): ``local`` goes; every gather dequantizes, an edit re-quantizes (:meth:`set_local`)."""
        assert self.local is not None and self.offload is None and self.master is None
        self.resting = torch.empty(packed_bytes(self.local.numel()), dtype=torch.int8, device=self.local.device)
        pack(self.local, self.resting)
        self.local = None
        ds_param_attrs.sync(self)

    def set_local(self, shard: torch.Tensor) -> None:
        """The resting shard gets new values (after a step or an edit): in place, or into the offload."""
        self.routes.drop_secondary()  # the primary shard changes: the secondary copy is stale
        if self.resting is not None:
            pack(shard, self.resting)
        elif self.offload is not None:
            self.offload.store(self, shard)
        else:
            assert self.local is not None
            self.local.copy_(shard)

    def retire(self) -> None:
        """A ``zero.Init`` bucket whose parameters moved into the engine's buckets: drop its storage."""
        self.data = self._placeholder
        _free(self._full)
        self.local = None
        self.master = None
        self.params = []
        self.state = ParamState.SHARDED  # terminal: holds nothing (not a lifecycle transition)

    def scatter_from(self, src: int) -> None:
        """After rank ``src`` edited the gathered parameters: broadcast, and every rank keeps its chunk."""
        assert self.state is ParamState.GATHERED
        (self.routes.world or self.coll).broadcast(self.data, src=src)  # every replica of the shard too (MiCS)
        shard = self.shard(self.data)
        self.set_local(shard)
        if self.master is not None:
            self.master.copy_(shard)

    # ---- figures ------------------------------------------------------------------------------
    def storage_bytes(self) -> int:
        """Bytes the full buffer's storage holds right now, whoever references it (0 when released)."""
        return self._full.untyped_storage().nbytes()

    @property
    def live_numel(self) -> int:
        """Elements of the full buffer currently allocated (0 when sharded)."""
        return 0 if self.state is ParamState.SHARDED else self.plan.padded_numel

    def held_bytes(self) -> int:
        local = self.local.numel() * self.local.element_size() if self.local is not None else 0
        local += self.resting.numel() if self.resting is not None else 0
        full = self.live_numel * self._placeholder.element_size()
        return local + full + self.routes.held_bytes()


def _free(flat: torch.Tensor) -> None:
    flat.untyped_storage().resize_(0)


def _held_elsewhere(flat: torch.Tensor) -> bool:
    """Whether a tensor other than ``flat`` shares its storage (True when torch cannot say)."""
    use_count = torch_compat.storage_use_count(flat)
    return use_count is None or use_count > 2  # ``flat`` and the storage object asked here


def refresh_together(buckets: list[PartitionedBucket], coll: Collectives) -> None:
    """Re-gather several gathered buckets from their (just stepped) shards in one all-gather per dtype.

    Small units (norms, biases, the persistent ones) each cost a whole collective's latency
    when refreshed one by one. Here rank r's chunk of one flat buffer is the concatenation
    of every bucket's chunk r, so a single all-gather moves exactly the same elements; then
    each bucket's chunks are copied back into its own buffer.
    """
    by_dtype: dict[torch.dtype, list[PartitionedBucket]] = {}
    for b in buckets:
        assert b.state is ParamState.GATHERED and b.local is not None
        by_dtype.setdefault(b.data.dtype, []).append(b)
    for group in by_dtype.values():
        world, total = coll.world_size, sum(b.shard_numel for b in group)
        flat = torch.empty(world * total, dtype=group[0].data.dtype, device=group[0].data.device)
        torch.cat([b.local for b in group], out=flat.narrow(0, coll.rank * total, total))  # type: ignore[misc]
        coll.all_gather(flat)
        rows, offset = flat.view(world, total), 0
        for b in group:
            b.data.view(world, b.shard_numel).copy_(rows.narrow(1, offset, b.shard_numel))
            offset += b.shard_numel
            b.bind()  # the module may have been moved (model.to) since: the parameters view the buffer again

