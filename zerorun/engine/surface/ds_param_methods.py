"""DeepSpeed's per-parameter methods on stage-3 parameters: ``all_gather``, ``all_gather_coalesced``, ``partition``.

DeepSpeed gives every ``zero.Init`` parameter these methods; scripts that predate
``GatheredParameters`` (and DeepSpeed's own tests) gather and re-partition parameters with
them by hand::

    p.all_gather()                       # or p.all_gather(param_list=[a, b])
    p.all_gather_coalesced([a, b]).wait()
    p.partition()                        # or p.partition(param_list=[a, b])

Here a parameter is gathered by gathering its bucket (a bucket holds one module's
parameters, so a neighbour is gathered with it), and ``partition`` releases the bucket unless
the engine's coordinator holds it for a forward or backward in progress. A gather is
complete when the call returns: the handle's ``wait()`` has nothing left to wait for. Values
edited between a gather and ``partition(has_been_updated=True)`` become every rank's shard
from rank 0's copy, as ``GatheredParameters(modifier_rank=0)`` does.

:func:`attach` binds them to a parameter (``ds_param_attrs.sync`` calls it once per parameter).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import torch
from torch import nn

from zerorun.engine.mechanism.param_state import BUCKET_ATTR, ParamState


class PartitionedBucket(Protocol):
    """What these methods use of a stage-3 bucket (:class:`zerorun.engine.mechanism.partition.PartitionedBucket`,
    whose module imports this one's through :mod:`~zerorun.engine.surface.ds_param_attrs`)."""

    persistent: bool
    state: ParamState
    holder: Callable[[Any], bool] | None

    def gather(self, exact: bool = False) -> None: ...
    def scatter_from(self, src: int) -> None: ...
    def release(self, keep_views: bool = False) -> None: ...


class GatheredHandle:
    """What ``all_gather_coalesced`` (and ``all_gather(async_op=True)``) return: already complete."""

    def wait(self, handle_dependency: bool = True) -> None:
        """The gather finished inside the call that returned this handle."""


def _buckets(param: nn.Parameter, param_list: Iterable[torch.Tensor] | None) -> list[PartitionedBucket]:
    params = [param] if param_list is None else list(param_list)
    found: dict[int, PartitionedBucket] = {}
    for p in params:
        b: PartitionedBucket | None = getattr(p, BUCKET_ATTR, None)
        if b is not None and not b.persistent:
            found[id(b)] = b
    return list(found.values())


def all_gather(param: nn.Parameter, param_list: Iterable[torch.Tensor] | None = None, async_op: bool = False,
               hierarchy: int = 0) -> GatheredHandle | None:
    """Gather ``param`` (or every parameter of ``param_list``) on every rank, until :func:`partition`."""
    for b in _buckets(param, param_list):
        b.gather(exact=True)
    return GatheredHandle() if async_op else None


def all_gather_coalesced(param: nn.Parameter, params: Iterable[torch.Tensor], safe_mode: bool = False,
                         quantize: bool = False) -> GatheredHandle:
    """Gather every parameter of ``params``; the returned handle's ``wait()`` returns at once."""
    for b in _buckets(param, params):
        b.gather(exact=not quantize)
    return GatheredHandle()


def partition(param: nn.Parameter, param_list: Iterable[torch.Tensor] | None = None, hierarchy: int = 0,
              has_been_updated: bool = False, free_data: bool = True) -> None:
    """Release ``param`` (or ``param_list``) back to its shard; ``has_been_updated``: rank 0's values become
    every rank's shard first. A bucket the coordinator holds for a running pass stays gathered."""
    for b in _buckets(param, param_list):
        if b.state is not ParamState.GATHERED:
            continue
        if has_been_updated:
            with torch.no_grad():
                b.scatter_from(0)
        if b.holder is None or not b.holder(b):
            b.release(keep_views=True)


_METHODS: dict[str, Any] = {"all_gather": all_gather, "all_gather_coalesced": all_gather_coalesced,
                            "partition": partition}


def attach(param: nn.Parameter) -> None:
    """Bind DeepSpeed's methods to ``param`` (plain instance attributes: no tensor dispatch)."""
    d = param.__dict__
    for name, fn in _METHODS.items():
        d[name] = types.MethodType(fn, param)
