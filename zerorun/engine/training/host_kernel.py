"""The optimizer kernel of a host step: torch's fused CPU kernel where it exists, foreach otherwise.

When the masters live in host memory (``offload_optimizer.device`` cpu or nvme) the CPU
steps them, and the kernel is the step's speed. Measured on the 2-core machine of
BENCHMARKS.md, one thread, 25M fp32 elements, one AdamW step: for-loop 308 ms, foreach 235,
fused 37, DeepSpeedCPUAdam 41. torch fuses Adam, AdamW, SGD and Adagrad on CPU (since 2.4);
whether the torch in use does is asked of the class itself (:func:`fuses_on_cpu`), so an
older torch falls back to foreach and a newer one that fuses more is picked up.

A client optimizer (``initialize(optimizer=...)``) is the user's: it is left as built, and
:func:`client_hint` names the faster build when there is one.
"""

from __future__ import annotations

import functools
import inspect
import warnings

import torch


class HostKernelHint(UserWarning):
    """A client optimizer steps host masters with a slower kernel than torch has for it."""


@functools.cache
def fuses_on_cpu(cls: type[torch.optim.Optimizer]) -> bool:
    """True when ``cls(..., fused=True)`` accepts CPU tensors in this torch (tried on one element)."""
    if "fused" not in inspect.signature(cls).parameters:
        return False
    probe = torch.nn.Parameter(torch.zeros(1, device="cpu"))
    try:
        cls([probe], fused=True)
    except (RuntimeError, TypeError, ValueError):  # torch says "not supported" in one of these
        return False
    return True


def kernel_kwargs(cls: type[torch.optim.Optimizer], params: dict[str, object], host_step: bool) -> dict[str, bool]:
    """The kernel flags to add to ``params``: none when the config chose (``fused``/``foreach``),
    ``fused`` for a host step of a class torch fuses on CPU, else ``foreach`` where the class has it."""
    if "fused" in params or "foreach" in params:
        return {}
    if host_step and fuses_on_cpu(cls):
        return {"fused": True}
    return {"foreach": True} if "foreach" in inspect.signature(cls).parameters else {}


def client_hint(optimizer: torch.optim.Optimizer, host_step: bool) -> str | None:
    """One line for a client optimizer that would step host masters faster built ``fused=True``."""
    cls = type(optimizer)
    if not host_step or optimizer.defaults.get("fused") or cls.__module__.split(".")[0] != "torch":
        return None
    if not fuses_on_cpu(cls):
        return None
    return (f"offload: the client optimizer {cls.__name__} steps the host masters with its "
            f"{'foreach' if optimizer.defaults.get('foreach') else 'default'} kernel; "
            f"torch.optim.{cls.__name__}(..., fused=True) is ~6x faster on the CPU (or name it in the config's "
            "optimizer block, which builds it fused)")


def warn_client(optimizer: torch.optim.Optimizer, host_step: bool) -> None:
    hint = client_hint(optimizer, host_step)
    if hint is not None:
        warnings.warn(HostKernelHint(hint), stacklevel=4)
