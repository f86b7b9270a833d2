"""Using a stage-3 parameter while it is sharded fails with an error that names the fix.

A partitioned parameter's class becomes :class:`ZeroParameter` (still an
``nn.Parameter``). Its ``__torch_function__`` lets metadata and plumbing through
(``.data``/``.grad``/``.shape`` and other attributes, ``detach``, ``to``, hooks, pickling)
and, for anything that reads values (``w.sum()``, ``w[0]``, ``print(w)``, ``F.linear``),
checks the parameter's bucket: gathered - the call runs unchanged; sharded or in flight -
:class:`ShardedParameterError` pointing at ``zero.GatheredParameters``. Inside forward
and backward the engine's hooks have gathered the unit, so model code never sees it.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from zerorun.engine.errors import EngineError
from zerorun.engine.param_state import ParamState

_PLUMBING = frozenset({
    "__get__", "__set__", "__delete__", "size", "dim", "numel", "element_size", "is_floating_point",
    "is_complex", "detach", "detach_", "to", "cpu", "cuda", "type", "requires_grad_", "register_hook",
    "register_post_accumulate_grad_hook", "__hash__", "__deepcopy__", "__reduce_ex__", "__setstate__",
    "_is_view", "untyped_storage", "data_ptr", "share_memory_", "__format__", "_has_compatible_shallow_copy_type",
    "is_shared", "is_pinned", "pin_memory", "get_device", "__len__",
})


class ShardedParameterError(EngineError):
    """A stage-3 parameter's values were read or written while only this rank's shard exists."""


class ZeroParameter(nn.Parameter):
    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if getattr(func, "__name__", "") not in _PLUMBING:
            # keyword arguments too: torch.nn.init passes the tensor as ``tensor=``
            for a in (*args, *(kwargs or {}).values()):
                for t in (a if isinstance(a, (list, tuple)) else (a,)):
                    if isinstance(t, ZeroParameter):
                        _check_gathered(t)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **(kwargs or {}))


def _check_gathered(param: ZeroParameter) -> None:
    bucket = param.__dict__.get("zr_bucket")
    if bucket is None or bucket.state is ParamState.GATHERED:
        return
    shape = next((tuple(s.shape) for p, s in zip(bucket.params, bucket.plan.slots, strict=True) if p is param), ())
    raise ShardedParameterError(
        f"a ZeRO stage-3 parameter of shape {shape} (in {bucket.name}) was read or written outside "
        "forward/backward while this rank holds only its shard",
        "wrap the access in `with zerorun.zero.GatheredParameters(params):` (add modifier_rank=0 to write "
        "it back), or use engine.save_16bit_model() for the full weights")


def mark_partitioned(param: nn.Parameter) -> None:
    """Give ``param`` the guarded class (a no-op for subclasses other than plain ``nn.Parameter``)."""
    if type(param) is nn.Parameter:
        param.__class__ = ZeroParameter
