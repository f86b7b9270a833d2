"""Count the collectives of systems we do not control (DDP, ZeroRedundancyOptimizer, FSDP2, DeepSpeed).

Wraps the ``torch.distributed`` functions they call and counts bytes with the engine's
convention (``zerorun.engine.comm.collectives``): an all-reduce counts twice its buffer (it
is a reduce-scatter plus an all-gather), a reduce-scatter its input, an all-gather its
output, a broadcast its buffer. DDP's reducer calls the backend from C++ (invisible
here); the runner adds its all-reduce of every gradient analytically (2 x 4 Psi bytes in
fp32), marked as such in the results.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.distributed as dist

TOTAL = {"bytes": 0}


def _nbytes(t: Any) -> int:
    if isinstance(t, (list, tuple)):
        return sum(_nbytes(x) for x in t)
    return t.numel() * t.element_size() if torch.is_tensor(t) else 0


_RULES = {
    "all_reduce": lambda a, k: 2 * _nbytes(a[0] if a else k.get("tensor")),
    "broadcast": lambda a, k: _nbytes(a[0] if a else k.get("tensor")),
    "reduce_scatter_tensor": lambda a, k: _nbytes(a[1] if len(a) > 1 else k.get("input")),
    "reduce_scatter": lambda a, k: _nbytes(a[1] if len(a) > 1 else k.get("input_list")),
    "all_gather_into_tensor": lambda a, k: _nbytes(a[0] if a else k.get("output_tensor")),
    "all_gather_single": lambda a, k: _nbytes(a[0] if a else k.get("output_tensor")),
    "reduce_scatter_single": lambda a, k: _nbytes(a[1] if len(a) > 1 else k.get("input")),
    "all_gather": lambda a, k: _nbytes(a[0] if a else k.get("tensor_list")),
}


def install() -> None:
    """Wrap the counted functions of ``torch.distributed`` (idempotent)."""
    for name, rule in _RULES.items():
        orig = getattr(dist, name, None)
        if orig is None:
            continue
        if getattr(orig, "_counted", False):
            continue

        @functools.wraps(orig)
        def wrapper(*args: Any, _orig: Any = orig, _rule: Any = rule, **kwargs: Any) -> Any:
            TOTAL["bytes"] += _rule(args, kwargs)
            return _orig(*args, **kwargs)

        wrapper._counted = True  # type: ignore[attr-defined]
        setattr(dist, name, wrapper)

