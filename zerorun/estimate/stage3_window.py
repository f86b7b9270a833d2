"""Stage 3's kept-gathered window and traffic per step, decided as the engine's gather coordinator decides.

Pure arithmetic over the units of one training pass (no torch): each unit is one bucket,
padded to a multiple of the world size times the alignment; a unit under
``stage3_param_persistence_threshold`` elements stays gathered and is re-gathered once
after each step. From the second step on the coordinator replays the first step's
order - forward in order, then backward in reverse - and after a unit's forward it
keeps the unit gathered when the unit is used again before ``stage3_max_reuse_distance``
other elements are (while under ``stage3_max_live_parameters``); it prefetches up to
``stage3_prefetch_bucket_size`` elements ahead within the same live cap. So the last
units of forward stay gathered into backward: that is the window, and backward does not
gather it again. Per step the engine moves

    first step:  2 x non-persistent (forward + backward all-gathers) + all (reduce-scatter) + persistent
    later steps: the same, less what the window kept

which is 3 Psi at ``stage3_max_reuse_distance`` 0 (mirrors :mod:`zerorun.engine.mechanism.gather`).

A head tied to the token embedding (``held``) is filed under the root module, which holds
it gathered from the start of forward to the end of backward from the second step on:
one gather per step instead of two. (On the first step it is gathered three times - for the
embedding, for the head's read, for the embedding's backward - which the first-step figure
leaves out: 0.06 Psi at GPT-2 1.5B.)
"""

from __future__ import annotations

from dataclasses import dataclass

from zerorun.estimate.shape import ModelShape


@dataclass(frozen=True)
class WindowPolicy:
    """The four stage-3 knobs (elements), with DeepSpeed's defaults."""

    max_live: int = 1_000_000_000
    max_reuse: int = 1_000_000_000
    prefetch: int = 50_000_000
    persistence_threshold: int = 100_000


@dataclass(frozen=True)
class Window:
    """What one rank's coordinator gathers in a steady-state step (elements, padding included)."""

    kept_numel: int  # non-persistent elements still gathered when forward ends (kept for backward)
    peak_live_numel: int  # most non-persistent elements gathered or in flight at once
    persistent_numel: int  # units under the persistence threshold: gathered at all times
    first_step_numel: int  # elements moved by the first step's collectives
    later_step_numel: int  # elements moved by every later step's collectives
    total_numel: int = 0  # every unit's bucket, padding included (the reduce-scatter's elements)
    later_forward_numel: int = 0  # of a later step's all-gathers, those issued in forward


def decoder_units(shape: ModelShape) -> list[int]:
    """Elements of each stage-3 unit of a decoder, in the order forward runs them.

    The embedding, per layer (norm, q, k, v, o, norm, [gate,] up, down), the final norm
    and an untied head; the module layout of Llama and of :mod:`zerorun.simulate.model`.
    """
    h, kv, f = shape.hidden, shape.kv_dim, shape.ffn_size
    layer = [h, h * h, h * kv, h * kv, h * h, h, *([h * f] if shape.gated_mlp else []), h * f, f * h]
    head = [] if shape.tied_embeddings else [shape.vocab * h]
    return [shape.vocab * h, *layer * shape.layers, h, *head]


ALIGN_ELEMENTS = 8  # the engine's unit alignment (zerorun.engine.mechanism.buckets.ALIGN_ELEMENTS)


def _padded(n: int, world_size: int) -> int:
    """A unit's bucket: its elements padded to a whole number of aligned shards (one parameter per
    unit in a decoder, so slot alignment adds nothing before the end)."""
    step = world_size * ALIGN_ELEMENTS
    return -(-n // step) * step


class _Replay:
    """One steady-state pass of the coordinator's decisions over units ``0..n-1``."""

    def __init__(self, sizes: list[int], persistent: list[bool], policy: WindowPolicy) -> None:
        self.sizes, self.persistent, self.policy = sizes, persistent, policy
        n = len(sizes)
        self.trace = [*range(n), *reversed(range(n))]
        self.state = ["gathered" if p else "sharded" for p in persistent]
        self.live: set[int] = set()
        self.moved = 0
        self.moved_in_forward = 0
        self.peak = 0

    def live_numel(self) -> int:
        return sum(self.sizes[i] for i in self.live)

    def gather(self, i: int) -> None:
        if self.state[i] == "sharded":
            self.moved += self.sizes[i]
            self.live.add(i)
        self.state[i] = "gathered"

    def release(self, i: int) -> None:
        if not self.persistent[i]:
            self.state[i] = "sharded"
            self.live.discard(i)

    def prefetch(self, pos: int) -> None:
        inflight = sum(self.sizes[i] for i in self.live if self.state[i] == "inflight")
        live = self.live_numel()
        for u in self.trace[pos:]:
            if self.state[u] != "sharded":
                continue
            n = self.sizes[u]
            if inflight + n > self.policy.prefetch or live + n > self.policy.max_live:
                return
            self.state[u] = "inflight"
            self.moved += n
            self.live.add(u)
            inflight += n
            live += n

    def pre_unit(self, u: int, pos: int) -> None:
        self.gather(u)
        if self.policy.prefetch > 0:
            self.prefetch(pos)
        self.peak = max(self.peak, self.live_numel())

    def needed_soon(self, i: int, pos: int) -> bool:
        between, seen = 0, set()
        for u in self.trace[pos:]:
            if u == i:
                return between < self.policy.max_reuse
            if u not in seen:
                seen.add(u)
                between += self.sizes[u]
            if between >= self.policy.max_reuse:
                return False
        return False

    def run(self, held: set[int]) -> int:
        """Replay forward then backward; the kept window (elements live when forward ends)."""
        for i in held:
            self.gather(i)
        pos = 0
        for i in range(len(self.sizes)):
            pos += 1
            self.pre_unit(i, pos)
            if self.state[i] != "gathered" or self.persistent[i] or i in held:
                continue
            if not (self.needed_soon(i, pos) and self.live_numel() <= self.policy.max_live):
                self.release(i)
        kept = self.live_numel()
        self.moved_in_forward = self.moved
        for i in reversed(range(len(self.sizes))):
            pos += 1
            self.pre_unit(i, pos)
            self.release(i)  # its gradients are in
        return kept


def stage3_window(units: list[int], world_size: int, policy: WindowPolicy, held: tuple[int, ...] = ()) -> Window:
    """The window and per-step traffic of ``units`` (elements each, forward order) on ``world_size`` ranks.

    ``held``: indices of units the root holds through the pass (a tied embedding).
    """
    sizes = [_padded(n, world_size) for n in units]
    persistent = [n < policy.persistence_threshold for n in units]
    total = sum(sizes)
    pers = sum(s for s, p in zip(sizes, persistent, strict=True) if p)
    replay = _Replay(sizes, persistent, policy)
    kept = replay.run(set(held))
    first = 2 * (total - pers) + total + pers
    return Window(kept, replay.peak, pers, first, replay.moved + total + pers, total, replay.moved_in_forward)


def decoder_window(shape: ModelShape, world_size: int, policy: WindowPolicy) -> Window:
    """:func:`stage3_window` of a decoder's units (a tied head holds the embedding)."""
    return stage3_window(decoder_units(shape), world_size, policy, held=(0,) if shape.tied_embeddings else ())
