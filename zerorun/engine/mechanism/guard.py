"""A stage-3 parameter is gathered when touched inside forward/backward, and guarded outside them.

While its bucket is sharded (or its all-gather is in flight) a partitioned parameter's
class is :class:`ZeroParameter` (still an ``nn.Parameter``). Its ``__torch_function__``
lets metadata and plumbing through (``.data``/``.grad``/``.shape`` and other attributes,
``detach``, ``to``, hooks, pickling); anything that reads values (``w.sum()``, ``w[0]``,
``print(w)``, ``F.linear``) asks the bucket's *toucher* (the stage-3 gather coordinator)
to gather it. Inside forward or backward the coordinator gathers the bucket, files it
under the unit that is running (so from the next step on it is gathered and prefetched
with that unit) and the call runs: a module that reads another module's weight
(``nn.MultiheadAttention``'s ``out_proj.weight``, ``F.linear(x, self.emb.weight)``)
needs no change. Outside them it is :class:`ShardedParameterError`, pointing at
``zero.GatheredParameters``.

While its bucket is gathered the parameter is a plain ``nn.Parameter`` again
(:func:`unguard`), so the ops of forward and backward pay no Python dispatch at all: the
guard costs something only when it has something to do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from torch import nn

from zerorun import torch_compat
from zerorun.engine.errors import EngineError
from zerorun.engine.mechanism.param_state import ParamState

if TYPE_CHECKING:
    from collections.abc import Callable

_PLUMBING = frozenset({
    "__get__", "__set__", "__delete__", "size", "dim", "numel", "element_size", "is_floating_point",
    "is_complex", "detach", "detach_", "to", "cpu", "cuda", "type", "requires_grad_", "register_hook",
    "register_post_accumulate_grad_hook", "__hash__", "__deepcopy__", "__reduce_ex__", "__setstate__",
    "_is_view", "untyped_storage", "data_ptr", "share_memory_", "__format__", "_has_compatible_shallow_copy_type",
    "is_shared", "is_pinned", "pin_memory", "get_device", "__len__",
})


class ShardedParameterError(EngineError):
    """A stage-3 parameter's values were read or written outside forward/backward while only this rank's shard exists."""


class ZeroParameter(nn.Parameter):
    @classmethod
    def __torch_function__(cls, func: Callable[..., Any], types: tuple[type, ...], args: tuple = (),
                           kwargs: dict | None = None) -> Any:  # what ``func`` returns
        if getattr(func, "__name__", "") not in _PLUMBING:
            # keyword arguments too: torch.nn.init passes the tensor as ``tensor=``
            for a in (*args, *(kwargs or {}).values()):
                for t in (a if isinstance(a, (list, tuple)) else (a,)):
                    if isinstance(t, ZeroParameter):
                        _ensure_gathered(t)
        return torch_compat.call_without_subclass(func, types, args, kwargs)


def _ensure_gathered(param: ZeroParameter) -> None:
    bucket = param.__dict__.get("zr_bucket")
    if bucket is None or bucket.state is ParamState.GATHERED:
        return
    toucher = bucket.toucher
    if toucher is not None and toucher(bucket):  # inside forward/backward: gathered on touch
        return
    shape = next((tuple(s.shape) for p, s in zip(bucket.params, bucket.plan.slots, strict=True) if p is param), ())
    raise ShardedParameterError(
        f"a ZeRO stage-3 parameter of shape {shape} (in {bucket.name}) was read or written outside "
        "forward/backward while this rank holds only its shard",
        "wrap the access in `with zerorun.zero.GatheredParameters(params):` (add modifier_rank=0 to write "
        "it back), or use engine.save_16bit_model() for the full weights")


def guard(param: nn.Parameter) -> None:
    """Sharded: give ``param`` the guarded class (only a plain ``nn.Parameter``; other subclasses stay)."""
    if type(param) is nn.Parameter:
        param.__class__ = ZeroParameter


def unguard(param: nn.Parameter) -> None:
    """Gathered: back to a plain ``nn.Parameter``, so ops on it skip ``__torch_function__``."""
    if type(param) is ZeroParameter:
        param.__class__ = nn.Parameter

