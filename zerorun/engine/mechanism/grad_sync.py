"""The backward pass's gradient reduction: how local gradients become owned, reduced ones.

All strategies share the same flow, driven by post-accumulate-grad hooks: a backward
pass is *armed* -> hooks call ``on_grad_ready`` as gradients land -> a bucket whose
parameters are all ready is launched (asynchronously) -> ``finish_backward()`` launches
leftover buckets (parameters unused in forward) in bucket order and waits for
everything. After the boundary micro-step ``owned_grads()`` gives, per bucket, the
reduced gradient chunk this rank steps.

Who arms and finishes a pass:

* ``engine.backward(loss)`` arms it (``prepare_backward``), runs autograd, and calls
  ``finish_backward()``; the loss is multiplied by the loss scale and divided by the
  accumulation steps first.
* A plain ``loss.backward()`` works too: the first gradient hook of the pass arms it
  (whether it is the boundary micro-step comes from the engine's micro-step count, i.e.
  from ``engine.step()`` being called every micro-step) and queues ``finish_backward``
  as an autograd end-of-backward callback, so gradients are reduced when
  ``backward()`` returns, as DDP's are. As in DeepSpeed 0.19.8, the engine's outputs divide
  such a backward by ``gradient_accumulation_steps``
  (:mod:`zerorun.engine.training.plain_backward`), so the step uses the mean over the
  micro-steps, as after ``engine.backward``; fp16's loss scale is not applied (through
  ``engine(...)`` under the dynamic scale the backward is refused as DeepSpeed refuses it;
  otherwise the step takes such passes unscaled, with a warning, and refuses a step that
  sums them with scaled ones; use ``engine.backward`` or ``engine.scale(loss).backward()``).
  Reentrant activation checkpointing runs nested backward passes that would end the pass
  early: use ``engine.backward`` with it.
* A pass whose backward raised (autograd stops; nothing finishes it) stays armed until the next
  root forward or step, which unwinds it (:meth:`GradSyncBase.unwind_aborted`, which says what
  it drops): it adds nothing to the step.

The reducers (the policy picks one, :mod:`zerorun.engine.policy`):

* :class:`~zerorun.engine.mechanism.full_grads.FullGradSync` with ``scatter=False`` (stage 0): full gradient buffers
  (``param.grad`` is a view into them, so autograd accumulates micro-steps in place;
  after ``zero()`` it is ``None`` and the first gradient is copied in, so no step
  begins with a memset), an all-reduce per bucket on the boundary micro-step only.
* :class:`~zerorun.engine.mechanism.full_grads.FullGradSync` with ``scatter=True`` (stage 1): same buffers, a
  reduce-scatter per bucket on the boundary micro-step; the rank owns its chunk. The
  other chunks are undefined afterwards, so the pass then detaches the bucket's
  ``param.grad`` (``None``: the reduced chunk is the engine's), and a second backward on
  the same micro-step (a GAN's discriminator: real, then fake) first folds the owned
  chunk into an fp32 sum (:class:`~zerorun.engine.mechanism.sharded_grads.ShardAccumulator`, stage 2's
  accumulator) and restarts the buffer from zero; its reduction adds to that sum. Stage 0
  needs nothing: its all-reduce leaves every rank the whole average, which the next
  reduction averages again unchanged.

* :class:`~zerorun.engine.mechanism.sharded_grads.ShardedGradSync` (stage 2): no full gradient buffers. Each gradient is
  copied into a bucket-sized staging buffer and freed; a full bucket is reduce-scattered
  on every micro-step (as DeepSpeed does), and the rank's chunk is accumulated into an
  fp32 shard. Staging buffers are taken from a pool that grows, while backward runs
  ahead of the reductions, up to ``staging_numel`` elements (``reduce_bucket_size``,
  twice with ``overlap_comm``: what DeepSpeed's one or two buckets hold) and at most
  :data:`~zerorun.engine.mechanism.sharded_grads.MAX_STAGING_BUFFERS` buckets; beyond it a hook waits for the oldest reduction
  to free its buffer.

Whatever the stage, the step uses the sum over all backward passes since the last step
of their rank-averaged gradients, as one backward of the summed loss would give.

Reductions are always issued asynchronously and waited for at the end of the pass (or
when their staging buffer is needed again): stages 0-1 reduce in the gradient buffers
themselves, so overlapping costs no memory there.

``zero()`` drops every gradient accumulated since the last optimizer step; the engine
routes ``model.zero_grad()`` and ``optimizer.zero_grad()`` to it
(:func:`route_zero_grad`), and a ``param.grad`` that user code replaced or set to
``None`` is noticed at the next gradient or step (stages 0-1; at stage 1 not after the
boundary reduction, which holds the reduced gradient itself).

Coalesced reduction (``engine.coalesce_grad_reduction()``, DeepSpeed's name): the passes inside the
block are non-syncing ones, and on exit :meth:`GradSyncBase.reduce_held` reduces what they left local,
once, as a boundary pass would. Stages 0-1 hold the whole gradients, so every bucket is reduced there,
once per step; stages 2-3 hold none (each pass reduce-scattered into the shard already), so only MiCS's
replica sum is left for the exit.

Averaging: gradients are multiplied by ``1/predivide`` before the reduction and by
``predivide/world`` after it (DeepSpeed's ``gradient_predivide_factor``).
"""

from __future__ import annotations

import functools
import warnings
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

from zerorun import torch_compat
from zerorun.engine.comm.collectives import Collectives, Pending
from zerorun.engine.comm.quantized import quantized_reduce_scatter
from zerorun.engine.mechanism.buckets import FlatBucket

if TYPE_CHECKING:
    from torch import nn


@dataclass(frozen=True)
class ReducePolicy:
    """How gradients are reduced (from the config)."""

    comm_dtype: torch.dtype | None  # None: the gradients' own dtype
    predivide: float = 1.0
    # gradient_allreduce_op: mean (divide by the world size) or sum (DeepSpeed's plain sum: no predivide either)
    average: bool = True
    overlap_comm: bool = True
    # stage 2: elements of staging buffers the backward may hold at once (filling or in flight).
    # None: one bucket, two with overlap_comm.
    staging_numel: int | None = None
    # the gradient shard's dtype (the masters'): fp32, or bf16 with bf16.bf16_master_weights_and_grads
    accum_dtype: torch.dtype = torch.float32
    # ZeRO++ qgZ (zero_quantized_gradients): reduce-scatters cross as int8 blocks, summed in fp32 on arrival
    quantized: bool = False
    # DeepSpeed's ``ignore_unused_parameters: false`` where it reads it (offload_optimizer cpu, stages 1-2):
    # the step asserts that every parameter got a gradient since the last step
    require_all_used: bool = False


class _Tracker:
    """Counts ready parameters per bucket within one backward pass."""

    def __init__(self, buckets: list[FlatBucket]) -> None:
        self.sizes = [len(b.params) for b in buckets]
        self.reset()

    def reset(self) -> None:
        self.ready = [0] * len(self.sizes)
        self.launched = [False] * len(self.sizes)
        self.next = 0  # in-order launching: the first bucket not launched yet

    def mark(self, index: int) -> bool:
        """Record one ready parameter; True when the bucket just became complete."""
        self.ready[index] += 1
        return self.ready[index] == self.sizes[index]


class GradSyncBase:
    def __init__(self, buckets: list[FlatBucket], coll: Collectives, policy: ReducePolicy) -> None:
        self.buckets = buckets
        self.coll = coll
        self.policy = policy
        self.tracker = _Tracker(buckets)
        self.inflight: deque[Pending] = deque()
        self.sync = True
        self.armed = False  # a backward pass is in progress
        self.unscaled_passes = 0  # plain loss.backward() passes since the last zero()
        self.pass_unscaled = 0  # what the armed pass added to unscaled_passes (taken back if it is unwound)
        self.window_passes = 0  # backward passes finished since the last zero()
        self.scaled_ahead = False  # engine.scale(loss) ran: the next plain pass is scaled
        self.boundary: Callable[[], bool] = lambda: True  # the engine's "is this the boundary micro-step?"
        self.used: set[tuple[int, int]] = set()  # (bucket, slot) with a gradient this window (require_all_used)
        self.pre = 1.0 / policy.predivide if policy.average else 1.0
        self.post = policy.predivide / coll.world_size if policy.average else 1.0

    def prepare_backward(self, sync: bool) -> None:
        """Arm a pass that the caller finishes itself with :meth:`finish_backward` (``engine.backward``)."""
        self.sync = sync
        self.tracker.reset()
        self.armed = True
        self.pass_unscaled = 0

    def on_grad_ready(self, bucket_index: int, slot_index: int, param: torch.Tensor) -> None:
        if not self.armed:  # a plain loss.backward(): arm now, finish when autograd is done
            self.prepare_backward(self.boundary())
            self.pass_unscaled = 0 if self.scaled_ahead else 1
            self.unscaled_passes += self.pass_unscaled
            torch_compat.queue_backward_callback(self.finish_backward)
        self._absorb(bucket_index, slot_index, param)
        if self.policy.require_all_used:
            self.used.add((bucket_index, slot_index))
        if self.tracker.mark(bucket_index) and self._reduces_now():
            self._launch_complete(bucket_index)

    # Stages 0-2 launch buckets in bucket order (the layout's, which is backward's usual order), as
    # DDP does: every rank then issues the same collectives in the same order even when its gradients
    # arrive in another (routing that differs by rank, as in MoE); a complete bucket waits for the
    # earlier ones. Stage 3 launches on completion: its gathers already need every rank on one path.
    in_order = True

    def _launch_complete(self, bucket_index: int) -> None:
        t = self.tracker
        if not self.in_order:
            self._launch(bucket_index)
            return
        while t.next < len(t.sizes) and t.ready[t.next] == t.sizes[t.next]:
            self._launch(t.next)
            t.next += 1

    def finish_backward(self) -> None:
        self.armed = False
        self.scaled_ahead = False  # engine.scale(loss) covers one pass (read by every output's hook until here)
        if self._reduces_now():
            for i in range(len(self.buckets)):
                if not self.tracker.launched[i]:
                    self._launch(i)
        while self.inflight:
            self.inflight.popleft().wait()
        self.window_passes += 1

    def unwind_aborted(self) -> None:
        """Unwind a pass that was armed and never finished: autograd raised inside it (a hook, a custom
        Function's backward, an activation checkpoint's recomputation), so :meth:`finish_backward` never ran.

        Called at the next root forward and at the step, outside backward; where no pass was aborted it
        reads one flag. The reductions the pass had issued are waited for (every rank issued them: none may
        pair with a later collective), what it staged is dropped, and the gradients it had summed already
        are discarded: exactly when it was the first backward since the last step; otherwise they are
        summed with the earlier backwards' of the window and cannot be told apart, so the window's
        gradients are all dropped, with a warning.
        """
        if not self.armed or torch_compat.in_backward():
            return
        self.armed = False
        self.scaled_ahead = False
        while self.inflight:
            self.inflight.popleft().wait()
        self._drop_pass()
        self.unscaled_passes -= self.pass_unscaled
        if self._partial_in_sum():
            if self.window_passes:
                warnings.warn(f"a backward pass raised after part of its gradients had been summed with the "
                              f"{self.window_passes} earlier backward pass(es) since the last step; they cannot be "
                              "told apart, so all of them are dropped: the next step applies only the backward "
                              "passes that follow", RuntimeWarning, stacklevel=4)
            self.zero()
        self.tracker.reset()

    def reduce_held(self) -> None:
        """Reduce what the non-syncing passes since the last reduction left local, as the boundary pass
        would have (``engine.coalesce_grad_reduction()``'s exit). Here (stage 2) every pass already
        reduce-scattered its gradients into the shard: nothing is held."""

    def _drop_pass(self) -> None:
        """Drop what an unwound pass holds outside the gradients the step reads (staging, gathered units)."""

    def _partial_in_sum(self) -> bool:
        """Did the unwound pass add to the gradients the step reads? (Stages 0-1: autograd accumulates
        into them, so any gradient that arrived did.)"""
        return any(self.tracker.ready)

    def _reduces_now(self) -> bool:
        return self.sync

    def check_all_used(self) -> None:
        """At the step, with ``require_all_used``: DeepSpeed's assertion (its words) when a parameter got no
        gradient since the last step; the window then starts again."""
        if not self.policy.require_all_used:
            return
        used, self.used = self.used, set()
        missing = sum(len(b.params) for b in self.buckets) - len(used)
        assert missing == 0, (
            f"{missing} trainable parameter(s) got no gradient since the last step. This assert indicates that "
            "your module has parameters that were not used in producing loss. You can avoid this assert by "
            "(1) enable ignore_unused_parameters option in zero_optimization config; (2) making sure all "
            "trainable parameters and `forward` function outputs participate in calculating loss.")

    def _absorb(self, bucket_index: int, slot_index: int, param: torch.Tensor) -> None:
        raise NotImplementedError

    def _launch(self, bucket_index: int) -> None:
        raise NotImplementedError

    def comm_dtype(self, flat: torch.Tensor) -> torch.dtype:
        """The dtype ``flat``'s reduction travels in."""
        return self.policy.comm_dtype or flat.dtype

    def _reduce(self, flat: torch.Tensor, scatter: bool, then, out: torch.Tensor | None = None,
                scale: float = 1.0) -> Pending:
        """Pre-scale, cast to the communication dtype if needed, reduce, and hand the result to ``then``.
        ``out``: a reduce-scatter's sum times ``scale`` lands there (of :meth:`comm_dtype`; not with qgZ)."""
        comm = flat if self.comm_dtype(flat) == flat.dtype else flat.to(self.policy.comm_dtype)
        if self.pre != 1.0:
            comm.mul_(self.pre)
        if scatter and self.policy.quantized:
            assert out is None, "qgZ's reduce-scatter sums into its own buffer"
            pending = quantized_reduce_scatter(self.coll, comm, async_op=True)
        elif scatter:
            pending = self.coll.reduce_scatter(comm, out=out, scale=scale, async_op=True)
        else:
            pending = self.coll.all_reduce(comm, async_op=True)
        pending.then(lambda: then(comm))
        self.inflight.append(pending)
        return pending


class _ZeroGradRoute:
    """``owner.zero_grad`` that also drops the engine's gradients (installed on the instance).

    Pickling or deep-copying the owner (``torch.save(model)``, an EMA copy) keeps the class's
    plain ``zero_grad``: the copy has no engine.
    """

    def __init__(self, owner: nn.Module | torch.optim.Optimizer, on_zero: Callable[[], None]) -> None:
        self.owner = owner
        self.plain = type(owner).zero_grad
        self.on_zero = on_zero

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self.plain(self.owner, *args, **kwargs)
        self.on_zero()

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return functools.partial, (self.plain, self.owner)


def route_zero_grad(owners: list[nn.Module | torch.optim.Optimizer], sync: GradSyncBase) -> None:
    """Make ``zero_grad()`` of each owner (the module, the optimizer) clear ``sync``'s gradients too."""
    for owner in owners:
        owner.zero_grad = _ZeroGradRoute(owner, sync.zero)
