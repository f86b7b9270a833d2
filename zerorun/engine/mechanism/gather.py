"""Just-in-time gathering of stage-3 parameter buckets, with the first step's order replayed for prefetch.

A *unit* is a module whose own (``recurse=False``) trainable parameters are non-empty;
its buckets are the buckets holding those parameters (a tied parameter lives in the
bucket of the first module that registered it, and every other module using it lists
that bucket too). Events, all on the calling thread:

* ``pre_unit`` - before a unit's forward (module forward pre-hook) and before its
  backward (a hook on the unit's forward outputs, fired when their gradient arrives):
  the unit's buckets are gathered (waiting for a prefetch in flight), then, while this
  pass follows the recorded order, the next buckets of the order are all-gathered
  asynchronously, bounded by ``prefetch_numel`` elements in flight and ``max_live``
  elements gathered in all.
* ``post_forward`` - the unit's buckets are released unless persistent, still used by
  an enclosing unit, needed again with fewer than ``max_reuse`` other elements gathered
  in between in the recorded order (while under ``max_live``; ``max_reuse`` 0 keeps
  nothing), or the forward is an activation-checkpoint recomputation inside backward.
* ``post_backward_bucket`` - all of a bucket's gradients have been accumulated (so no
  backward node still needs its values): released.
* ``end_pass`` (after backward) - everything in flight is waited for and every
  non-persistent bucket released; the first training pass becomes the recorded order.
  A backward that raised never ends its pass: the next root forward (``begin_forward``)
  ends it, after the reducer has unwound its side (``reducer.unwind_aborted``).

* ``touch`` - a sharded parameter was used inside forward or backward without its unit
  listing it (``nn.MultiheadAttention`` reads ``out_proj.weight`` without calling
  ``out_proj``; a tied head calls ``F.linear(x, self.emb.weight)``): its bucket is
  gathered on the spot and filed under the innermost unit running forward (the root
  module is always a unit, so there is one), which from then on gathers, prefetches,
  keeps for backward and releases it like its own. A touch in backward outside any
  unit's forward is gathered until its gradients are in (or the pass ends).
* a unit *returns* a parameter (a bias its caller adds): the caller reads it after the
  unit's forward, so it is filed under the enclosing unit like a touch, and stays gathered
  until that unit's forward ends (DeepSpeed's "external parameter" of the caller).

Frozen buckets (parameters the optimizer does not step) get no gradients, so no
gradient hook says when backward is done with them: a unit's frozen bucket is released
once the gradients of that unit's inputs are computed (its backward is over) and no
other unit whose backward has begun may still read it; a unit whose inputs need no
gradient keeps it until the end of the pass.

A pass whose events leave the recorded order (data-dependent control flow) stops
prefetching and gathers on demand for the rest of that pass: prefetching is only an
optimisation, every unit still gathers what it needs. All ranks must run the same units
in the same order (as with DeepSpeed and FSDP): the gathers are collectives.
"""

from __future__ import annotations

import warnings
import weakref
from typing import TYPE_CHECKING

import torch
from torch import nn

from zerorun import torch_compat
from zerorun.engine.mechanism.buffer_pool import BufferPool
from zerorun.engine.mechanism.gather_plan import GatherPolicy, GatherStats, Unit, Unwinding
from zerorun.engine.mechanism.param_state import BUCKET_ATTR, ParamState
from zerorun.engine.mechanism.partition import PartitionedBucket, refresh_together

if TYPE_CHECKING:
    from collections.abc import Callable


def _in_backward() -> bool:
    return torch_compat.in_backward()


class GatherCoordinator:
    def __init__(self, buckets: list[PartitionedBucket], units: list[Unit], policy: GatherPolicy) -> None:
        self.buckets = buckets
        self.units = units
        self.policy = policy
        self.stats = GatherStats()
        self.trace: list[int] | None = None
        self.current: list[int] = []
        self.pos = 0
        self.on_order = False
        self.active = [0] * len(buckets)  # enclosing forwards using each bucket right now
        self.unit_buckets = [list(unit.buckets) for unit in units]  # grows with touched buckets
        self.stack: list[tuple[int, list[int]]] = []  # units in forward, with the buckets each holds active
        self.index_of = {id(b): i for i, b in enumerate(buckets)}
        self.frozen_open = [0] * len(buckets)  # unit backwards under way that may read each frozen bucket
        # host buffers released inside a pass are reused by its next gathers, handed back at its end
        self.pool = BufferPool.for_devices({b.data.device for b in buckets})
        for b in buckets:
            b.toucher = self.touch
            b.holder = self.hold
            b.pool = self.pool
        self.live: set[int] = {i for i, b in enumerate(buckets)
                               if not b.persistent and b.state is not ParamState.SHARDED}
        self.handles: list[torch.utils.hooks.RemovableHandle] = []
        self.warned_leaf = False  # a leaf unit ran with no input requiring grad (DeepSpeed refuses it): said once
        self.on_returned: Callable[[nn.Parameter], None] | None = None  # a unit returned this parameter
        # the reducer, which unwinds a backward that raised (weakly: the module's hooks must not keep its gradients)
        self.reducer: weakref.ReferenceType[Unwinding] | None = None

    # ---- hooks ------------------------------------------------------------------------------
    def attach(self, root: nn.Module, modules: list[nn.Module]) -> None:
        for unit, module in zip(self.units, modules, strict=True):
            self.handles.append(module.register_forward_pre_hook(
                lambda _m, _a, u=unit.index: self.pre_forward(u)))
            self.handles.append(module.register_forward_hook(
                lambda _m, args, out, u=unit.index: self.post_forward(u, out, args)))
        self.handles.append(root.register_forward_pre_hook(lambda _m, _a: self.begin_forward(), prepend=True))

    def regroup(self, root: nn.Module, units: list[Unit], modules: list[nn.Module]) -> None:
        """New units (between passes): the hooks move to ``modules``; the recorded order starts over."""
        if self.current or self.stack:
            raise RuntimeError("the stage-3 units change only between training steps (a forward is under way)")
        for handle in self.handles:
            handle.remove()
        self.handles = []
        self.units = units
        self.unit_buckets = [list(unit.buckets) for unit in units]
        self.trace, self.pos, self.on_order = None, 0, False
        self.attach(root, modules)

    def begin_forward(self) -> None:
        if _in_backward():
            return
        reducer = self.reducer() if self.reducer is not None else None
        if reducer is not None and reducer.armed:  # a backward that raised left its pass armed: unwound first
            reducer.unwind_aborted()
        self.stack.clear()  # a forward that raised left its units on the stack
        if self.current:  # a forward without backward (eval) ended
            self.end_pass(record=False)

    def pre_forward(self, u: int) -> None:
        if _in_backward():
            # an activation-checkpoint recomputation: gather for it, hold nothing. The non-reentrant
            # variant stops the recomputation by raising inside the unit, so no post-forward would
            # ever close what this forward opened; the gradients release the buckets instead.
            self.pre_unit(u)
            return
        held = list(self.unit_buckets[u])
        for bi in held:
            self.active[bi] += 1
        self.stack.append((u, held))
        self.pre_unit(u)

    def post_forward(self, u: int, output: object, inputs: object = ()) -> object:
        if _in_backward():  # a recomputation (see pre_forward): kept for the backward that follows
            self._close_frozen_after(u, inputs)
            return output
        held = self.stack.pop()[1] if self.stack and self.stack[-1][0] == u else []
        for bi in held:
            self.active[bi] -= 1
        leaves = torch_compat.tree_leaves(output)
        if self.stack:
            self._keep_returned(leaves)
        if torch.is_grad_enabled() and not self._arm_backward(u, leaves, inputs, held):
            return output  # autograd may read these buckets and nothing would gather them first: kept
        for bi in held:
            self._maybe_release(bi)
        return output

    def _keep_returned(self, leaves: list[object]) -> None:
        """A unit returned a parameter (its own, say a bias the caller adds): the caller uses it after the unit's
        forward, so the enclosing unit holds its bucket, now and in every later pass (DeepSpeed keeps it gathered
        as the caller's external parameter); ``on_returned`` hears of it."""
        for t in leaves:
            b = t.__dict__.get(BUCKET_ATTR) if isinstance(t, nn.Parameter) else None
            if b is not None and (bi := self.index_of.get(id(b))) is not None:
                self._file(bi)
                if self.on_returned is not None:
                    self.on_returned(t)

    def hold(self, bucket: PartitionedBucket) -> bool:
        """``GatheredParameters`` exits inside forward/backward: keep ``bucket`` for autograd (else False).

        Inside forward the bucket is filed under the running unit (as a touch is); inside
        backward it stays gathered until its gradients are in (a trainable bucket) or the pass
        ends, so a gradient autograd has yet to store always finds its parameter whole.
        """
        if not self.stack and not _in_backward():
            return False
        self._file(self.index_of[id(bucket)])
        return True

    def touch(self, bucket: PartitionedBucket) -> bool:
        """A guarded parameter of ``bucket`` is used: gather it if inside forward/backward (else False)."""
        if not self.stack and not _in_backward():
            return False  # outside forward/backward: the caller raises ShardedParameterError
        bi = self.index_of[id(bucket)]
        self._file(bi)
        self.stats.touches += 1
        self._gather(bi)
        return True

    def _file(self, bi: int) -> None:
        """Inside a unit's forward, bucket ``bi`` becomes that unit's (held now, gathered with it from now on)."""
        if self.stack:
            u, held = self.stack[-1]
            if bi not in held:
                held.append(bi)
                self.active[bi] += 1
            if bi not in self.unit_buckets[u]:
                self.unit_buckets[u].append(bi)  # recorded: the unit gathers and prefetches it from now on
        if not self.buckets[bi].persistent and self.buckets[bi].state is not ParamState.SHARDED:
            self.live.add(bi)

    def _arm_backward(self, u: int, leaves: list[object], inputs: object, held: list[int]) -> bool:
        """Gather the unit when its outputs' gradient arrives; a unit holding frozen buckets also
        learns when its backward is over: the gradients of its inputs have been computed.

        True when releasing the unit now is safe: a hook will gather it before autograd reads
        the views it saved, or autograd recorded nothing of it (no input needs a gradient and
        every bucket it holds is frozen). Outputs that hide their tensors from the pytree (a
        custom container) leave neither true: the unit stays gathered until its gradients are in.
        """
        fired = [False]
        frozen = [bi for bi in self.unit_buckets[u] if self.buckets[bi].frozen]
        grad_inputs = [t for t in torch_compat.tree_leaves(inputs) if torch.is_tensor(t) and t.requires_grad]
        if self.units[u].leaf and not grad_inputs and not self.warned_leaf:
            self.warned_leaf = True
            warnings.warn(f"ZeRO-3 leaf module {self.units[u].name}: no input requires grad. DeepSpeed raises a "
                          "RuntimeError here; zerorun trains it (its buckets stay gathered until their gradients "
                          "are in)", RuntimeWarning, stacklevel=2)

        def pre_backward(grad: torch.Tensor) -> None:
            if not fired[0]:
                fired[0] = True
                for bi in frozen:  # without grad inputs this never closes: kept until the pass ends
                    self.frozen_open[bi] += 1
                self.pre_unit(u)

        def backward_done(_grads: object) -> None:
            if fired[0]:
                self._close_frozen(frozen)

        hooked = False
        for t in leaves:  # a leaf (a returned parameter or input) is not this unit's work, and would keep the hook
            if torch.is_tensor(t) and t.grad_fn is not None:
                t.register_hook(pre_backward)
                hooked = True
        if frozen and grad_inputs:
            torch.autograd.graph.register_multi_grad_hook(grad_inputs, backward_done)
        return hooked or (not grad_inputs and all(self.buckets[bi].frozen for bi in held))

    def _close_frozen_after(self, u: int, inputs: object) -> None:
        """A recomputed unit's frozen buckets that no outer hook closes (reentrant checkpointing ran the
        first forward without grad): released once the recomputation's inputs have their gradients."""
        frozen = [bi for bi in self.unit_buckets[u] if self.buckets[bi].frozen and self.frozen_open[bi] == 0]
        grad_inputs = [t for t in torch_compat.tree_leaves(inputs) if torch.is_tensor(t) and t.requires_grad]
        if not (frozen and grad_inputs and torch.is_grad_enabled()):
            return
        for bi in frozen:
            self.frozen_open[bi] += 1
        torch.autograd.graph.register_multi_grad_hook(grad_inputs, lambda _grads: self._close_frozen(frozen))

    def _close_frozen(self, frozen: list[int]) -> None:
        """A unit's backward that may read these frozen buckets is over: release those no other one may read."""
        for bi in frozen:
            self.frozen_open[bi] -= 1
            if self.frozen_open[bi] == 0 and self.active[bi] == 0:
                self._release_now(bi)

    # ---- gathering ----------------------------------------------------------------------------
    def pre_unit(self, u: int) -> None:
        self._advance(u)
        for bi in self.unit_buckets[u]:
            self._gather(bi)
        if self.on_order and self.policy.prefetch_numel > 0:
            self._prefetch()

    def _advance(self, u: int) -> None:
        self.current.append(u)
        if not self.on_order:
            return
        assert self.trace is not None
        if self.pos < len(self.trace) and self.trace[self.pos] == u:
            self.pos += 1
        else:
            self.on_order = False
            self.stats.fallbacks += 1

    def _gather(self, bi: int) -> None:
        b = self.buckets[bi]
        if b.state is ParamState.GATHERED:
            return
        b.gather()
        self._track(bi)

    def _track(self, bi: int) -> None:
        if not self.buckets[bi].persistent:
            self.live.add(bi)
        self.stats.peak_live_numel = max(self.stats.peak_live_numel, self.live_numel())

    def live_numel(self) -> int:
        return sum(self.buckets[i].plan.padded_numel for i in self.live)

    def _inflight_numel(self) -> int:
        return sum(self.buckets[i].plan.padded_numel for i in self.live
                   if self.buckets[i].state is ParamState.IN_FLIGHT)

    def _prefetch(self) -> None:
        picked = self._prefetch_picks()
        for bi in picked:  # offloaded shards: every read is in flight before the first all-gather waits
            self.buckets[bi].read_ahead()
        for bi in picked:
            self.buckets[bi].gather_async()
            self.stats.prefetched += 1
            self._track(bi)

    def _prefetch_picks(self) -> list[int]:
        """The sharded buckets next in the recorded order that fit the prefetch and live windows."""
        assert self.trace is not None
        inflight, live = self._inflight_numel(), self.live_numel()
        picked: list[int] = []
        for u in self.trace[self.pos:]:
            for bi in self.unit_buckets[u]:
                b = self.buckets[bi]
                if b.state is not ParamState.SHARDED or bi in picked:
                    continue
                n = b.plan.padded_numel
                if inflight + n > self.policy.prefetch_numel or live + n > self.policy.max_live:
                    return picked
                picked.append(bi)
                inflight += n
                live += n
        return picked

    # ---- releasing ----------------------------------------------------------------------------
    def _maybe_release(self, bi: int) -> None:
        b = self.buckets[bi]
        if b.persistent or self.active[bi] > 0 or b.state is not ParamState.GATHERED:
            return
        if self._needed_soon(bi) and self.live_numel() <= self.policy.max_live:
            return
        b.release(reuse=True)
        self.live.discard(bi)

    def _needed_soon(self, bi: int) -> bool:
        """Is bucket ``bi`` used again within ``max_reuse`` elements of the recorded order?"""
        if not self.on_order or self.trace is None:
            return False
        between = 0
        seen: set[int] = set()
        for u in self.trace[self.pos:]:
            buckets = self.unit_buckets[u]
            if bi in buckets:
                return between < self.policy.max_reuse
            for other in buckets:
                if other not in seen:
                    seen.add(other)
                    between += self.buckets[other].plan.padded_numel
            if between >= self.policy.max_reuse:
                return False
        return False

    def post_backward_bucket(self, bi: int) -> None:
        if self.active[bi] == 0:
            self._release_now(bi)

    def _release_now(self, bi: int) -> None:
        b = self.buckets[bi]
        if b.persistent or b.state is ParamState.SHARDED:
            return
        if b.state is ParamState.IN_FLIGHT:
            b.wait()
        b.release(reuse=True)
        self.live.discard(bi)

    def release_all(self) -> None:
        """Release every gathered bucket that is not persistent (waiting for any still in flight)."""
        for bi in sorted(self.live):
            self._release_now(bi)
        if self.pool is not None:  # nothing is gathered: the kept bytes go back to the allocator
            self.pool.drain()

    def end_pass(self, record: bool = True) -> None:
        self.release_all()
        self.stats.history.append(len(self.current))
        if record and self.trace is None and self.current:
            self.trace = list(self.current)
        self.current = []
        self.stack.clear()
        self.pos = 0
        self.on_order = self.trace is not None
        self.active = [0] * len(self.buckets)
        self.frozen_open = [0] * len(self.buckets)

    def after_step(self) -> None:
        """The shards changed: nothing gathered may hold stale values; persistent buckets re-gather."""
        self.release_all()
        for b in self.buckets:  # hpZ: the secondary copies hold the old values
            b.routes.drop_secondary()
        stale = [b for b in self.buckets if b.persistent and not b.frozen and b.state is ParamState.GATHERED]
        if stale:
            refresh_together(stale, stale[0].coll)
