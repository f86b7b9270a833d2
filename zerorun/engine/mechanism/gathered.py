"""``zero.Init`` and ``zero.GatheredParameters`` (public as :mod:`zerorun.zero`), on the stage-3 buckets.

``Init``: modules constructed inside the context have their own parameters sharded right
after their constructor returns (the outermost ``__init__`` of each object), so the whole
model never exists on one rank; each module's values are broadcast from rank 0 first, so
they equal an unsharded build with the same seed. Each module's parameters are moved to
the engine's device (``ctx.device``) before they are packed, broadcast and sharded, so
the shards (and every later gather) live there and ``model.to(device)`` afterwards
changes nothing. ``initialize`` (stage 3) turns these
shards into the engine's buckets unit by unit. With a config whose stage is not 3, or
``enabled=False``, the model is built normally (one script serves every stage).

``GatheredParameters``: all-gathers the given stage-3 parameters on every rank for the
body of the ``with``; with ``modifier_rank=r``, rank r's edits are broadcast and every
rank keeps its chunk (the fp32 master too) on exit. Parameters that are not partitioned
(stages 0-2, persistent ones) are left alone, as in DeepSpeed.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from zerorun.engine.mechanism import quantized_units
from zerorun.engine.mechanism.param_state import ParamState
from zerorun.engine.mechanism.partition import PartitionedBucket, bucket_of, unit_bucket
from zerorun.engine.mechanism.routes import GatherRoutes

if TYPE_CHECKING:
    from collections.abc import Callable

    from zerorun.config.load import Source
    from zerorun.engine.comm.collectives import Collectives

_DEPTH = "_zr_init_depth"


def _subclasses(cls: type) -> list[type]:
    out, stack = [], [cls]
    while stack:
        c = stack.pop()
        out.append(c)
        stack.extend(c.__subclasses__())
    return out


def _sharding(config: Source, world_size: int) -> tuple[bool, int]:
    """Whether ``config``'s stage shards parameters (no config: ``Init`` is asked to shard, so it does),
    and its ``mics_shard_size`` (0: over the world)."""
    if config is None:
        return True, 0
    from zerorun.config import load_config
    from zerorun.engine.policy import policy_for_stage

    zero = load_config(config, world_size=world_size).zero_optimization
    return policy_for_stage(int(zero.stage)).shard_parameters, max(zero.mics_shard_size, 0)


class Init:
    """``with zero.Init(config=cfg): model = Big()`` - build a stage-3 model already sharded."""

    def __init__(self, module: nn.Module | None = None, config: Source = None, enabled: bool = True,
                 config_dict_or_path: Source = None, zero_quantized_weights: bool = False,
                 zero_quantized_nontrainable_weights: bool = False, data_parallel_group: object = None,
                 **kwargs: Any) -> None:
        """``zero_quantized_weights``/``zero_quantized_nontrainable_weights``: ZeRO++'s qwZ and quantized
        frozen shards for the parameters built here, as the config keys of the same names ask for all.
        ``data_parallel_group``: a group the caller passed (the whole world: zerorun shards over no other);
        given, a world of one rank is taken as intended (zerorun.engine.comm.launcher_world)."""
        self.config = config if config is not None else config_dict_or_path
        self.explicit_group = data_parallel_group
        self.enabled = enabled
        self.quantized = (zero_quantized_weights, zero_quantized_nontrainable_weights)
        self.coll: Collectives | None = None  # the group the parameters are sharded over (MiCS's, or the world)
        self.world: Collectives | None = None  # rank 0's values are broadcast over it
        self.device: torch.device | None = None
        self._building: list[list[PartitionedBucket]] = []  # per constructor running: buckets it touched
        self._on_meta: list[nn.Module] = []  # built on the meta device (skip_init): sharded once materialised
        self._patched: list[tuple[type, Callable[..., None]]] = []  # each class's own __init__
        self._had_init_subclass = False
        if module is not None and enabled:  # DeepSpeed's Init(module=m): shard an existing model now
            with self:
                for m in module.modules():
                    self._shard_module(m)

    def __enter__(self) -> Init:
        if not self.enabled:
            return self
        from zerorun.engine.comm.bootstrap import init_distributed
        from zerorun.engine.comm.collectives import Collectives
        from zerorun.engine.comm.groups import build_groups
        from zerorun.engine.comm.launcher_world import check_launcher_world

        ctx = init_distributed()
        shards, mics = _sharding(self.config, ctx.world_size)
        if not shards:
            self.enabled = False
            return self
        check_launcher_world(ctx.world_size, self.explicit_group)  # a world of one under a launcher of several
        self.world = Collectives(ctx.group, ctx.world_size, ctx.rank)  # at world 1 too: the backend's policy
        # MiCS: sharded inside the shard group already, so initialize adopts these buckets as they are
        self.coll = build_groups(self.world, 1, mics, False).shard if mics else self.world
        self.device = ctx.device  # buckets are built and broadcast where the engine computes
        for cls in _subclasses(nn.Module):
            if "__init__" in cls.__dict__:
                self._wrap(cls)
        init = self

        def init_subclass(cls: type, **kw: Any) -> None:
            super(nn.Module, cls).__init_subclass__(**kw)
            if "__init__" in cls.__dict__:
                init._wrap(cls)

        self._had_init_subclass = "__init_subclass__" in nn.Module.__dict__
        nn.Module.__init_subclass__ = classmethod(init_subclass)  # type: ignore[assignment]
        return self

    def __exit__(self, *exc: object) -> None:
        if self.enabled and exc[0] is None:
            self._shard_materialised()
        self._on_meta.clear()
        for cls, orig in reversed(self._patched):
            cls.__init__ = orig  # type: ignore[misc]
        self._patched.clear()
        if self.enabled and not self._had_init_subclass and "__init_subclass__" in nn.Module.__dict__:
            del nn.Module.__init_subclass__

    def _wrap(self, cls: type) -> None:
        orig = cls.__dict__["__init__"]
        init = self

        @functools.wraps(orig)
        def wrapped(module: nn.Module, *args: Any, **kwargs: Any) -> None:
            depth = module.__dict__.get(_DEPTH, 0)
            module.__dict__[_DEPTH] = depth + 1
            init._building.append([])
            try:
                orig(module, *args, **kwargs)
            finally:
                module.__dict__[_DEPTH] = depth
                touched = init._building.pop()
            init._reshard(touched)
            if depth == 0:
                del module.__dict__[_DEPTH]
                init._shard_materialised()
                init._shard_module(module)

        cls.__init__ = wrapped  # type: ignore[misc]
        self._patched.append((cls, orig))

    def _shard_materialised(self) -> None:
        """Modules built on the meta device (``torch.nn.utils.skip_init`` builds there, then ``to_empty``)
        are sharded once their parameters are real: when the next constructor ends, or at the exit."""
        waiting, self._on_meta = self._on_meta, []
        for module in waiting:
            self._shard_module(module)

    def _shard_module(self, module: nn.Module) -> None:
        params = [p for p in module.__dict__.get("_parameters", {}).values()
                  if p is not None and bucket_of(p) is None]
        real_device = self.device is not None and self.device.type != "meta"  # a simulated world computes on meta
        if real_device and any(p.is_meta for p in params):  # no values to broadcast yet
            self._on_meta.append(module)
            return
        if not params:
            return
        quantized_units.mark(params, *self.quantized)
        assert self.coll is not None and self.world is not None
        b = unit_bucket(params, self.coll, type(module).__name__, device=self.device)
        b.provisional = True
        b.toucher = self._touch
        if self.coll is not self.world:  # GatheredParameters(modifier_rank=r) broadcasts from world rank r
            b.routes = GatherRoutes(world=self.world)
        with torch.no_grad():
            self.world.broadcast(b.data, src=0)
        b.seal()
        b.release()

    def _touch(self, bucket: PartitionedBucket) -> bool:
        """A constructor uses a child's sharded parameter (``nn.MultiheadAttention`` initialises
        ``out_proj.bias``): gather it until that constructor returns. Outside constructors: False."""
        if not self._building:
            return False
        bucket.gather()
        self._building[-1].append(bucket)
        return True

    def _reshard(self, touched: list[PartitionedBucket]) -> None:
        """Rank 0's values of what a constructor touched (it may have written them) become every rank's shards."""
        for b in {id(b): b for b in touched}.values():
            if b.state is ParamState.GATHERED:
                with torch.no_grad():
                    b.scatter_from(0)
                b.release()


def _as_list(params: torch.Tensor | Iterable[torch.Tensor] | None) -> list[torch.Tensor]:
    if params is None:
        return []
    if torch.is_tensor(params):
        return [params]
    return list(params) if isinstance(params, Iterable) else [params]


@contextlib.contextmanager
def GatheredParameters(params: torch.Tensor | Iterable[torch.Tensor] | None,  # noqa: N802
                       modifier_rank: int | None = None, fwd_module: nn.Module | None = None,
                       enabled: bool = True) -> Iterator[None]:
    """Gather partitioned ``params`` on every rank; with ``modifier_rank``, that rank's edits land everywhere."""
    buckets: dict[int, PartitionedBucket] = {}
    for p in _as_list(params):
        b = bucket_of(p)
        if b is not None and not b.persistent:
            buckets[id(b)] = b
    if not enabled or not buckets:
        yield
        return
    to_release = [b for b in buckets.values() if b.state is not ParamState.GATHERED]
    for b in buckets.values():
        b.gather(exact=True)  # exact, as DeepSpeed's GatheredParameters is under qwZ
    try:
        yield
    finally:
        if modifier_rank is not None:
            with torch.no_grad():
                for b in buckets.values():
                    b.scatter_from(modifier_rank)
        for b in to_release:  # what autograd may still read stays with the engine's coordinator
            if b.holder is None or not b.holder(b):
                b.release(keep_views=True)  # a tensor the body took from a parameter keeps its bytes


def gathered_frozen(frozen: list[PartitionedBucket],
                    modifier_rank: int | None = None) -> contextlib.AbstractContextManager[None]:
    """Gather the sharded parameters the optimizer does not step, on every rank, for a ``with``.

    The checkpoint writes and reads frozen parameters with the buffers, as whole tensors;
    with no frozen buckets (parameters not sharded) it does nothing.
    """
    return GatheredParameters([p for b in frozen for p in b.params], modifier_rank)
