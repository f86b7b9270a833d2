"""Host memory that costs nothing, for a simulated world on the meta device.

On ``meta`` the engine's device tensors hold no storage, but offload makes host tensors
(masters, optimizer state, the gradient accumulator, resting parameter shards), and a
real CPU tensor cannot be filled from a meta one (``Cannot copy out of meta tensor``) nor
would a 7B model's host state fit this machine. Inside :func:`host_stand_in` every host
tensor the engine makes is a meta tensor too, *tagged as host*: a factory asked for the
CPU (``torch.empty(n, device="cpu")``, or with the CPU as the default device), a copy to
the CPU (``.cpu()``, ``.to("cpu")``), and whatever an operation makes from host tensors
alone (``zeros_like(master)``: the optimizer's state). Views share their base's storage,
so they are host tensors too. Nothing is allocated, so any model at any world runs.

:func:`is_host` tells the two sides apart by where a tensor lives (its storage's tag, or a
real CPU tensor), whatever the engine's design: :mod:`zerorun.simulate.resident` counts
the bytes on each side with it. Only the ``with``'s own thread is covered (torch's
dispatch modes are thread-local); the engine's NVMe swapper, which works on a thread pool,
writes and reads no files in a simulated world on meta.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from zerorun import torch_compat

_HOST = torch.device("cpu")
_META = torch.device("meta")
# the storages tagged as host, by the address of their implementation; the storage object is kept, so
# the address is never reused by a device storage while the tag stands (a meta storage costs nothing)
_TAGGED: dict[int, torch.UntypedStorage] = {}
_DEVICE_ARG: dict[Any, bool] = {}  # per op: whether its schema takes a device (a factory, or a copy to a device)


def _key(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def tag(t: torch.Tensor) -> torch.Tensor:
    """Mark ``t``'s storage as host memory (a meta tensor of a simulated world)."""
    if t.device.type == "meta":
        storage = t.untyped_storage()
        _TAGGED[storage._cdata] = storage
    return t


def is_host(t: torch.Tensor) -> bool:
    """Whether ``t`` lives in host memory: a real CPU tensor, or a meta tensor tagged as host."""
    return t.device.type == "cpu" or (t.device.type == "meta" and _key(t) in _TAGGED)


def _tensors(tree: Any) -> list[torch.Tensor]:
    return [x for x in torch_compat.tree_leaves(tree) if isinstance(x, torch.Tensor)]


class HostStandIn(torch_compat.dispatch_mode_class()):  # type: ignore[misc]
    """Turns every op that would make a host tensor from meta data into one that makes a tagged meta tensor."""

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        names = _DEVICE_ARG.get(func)
        if names is None:
            names = _DEVICE_ARG[func] = any(a.name == "device" for a in func._schema.arguments)
        if not names:
            return self._plain(func, args, kwargs) if _TAGGED else func(*args, **kwargs)
        inputs = _tensors((args, kwargs))
        device = kwargs.get("device")
        to_host = device is not None and torch.device(device).type == "cpu"
        if not inputs:  # a factory: on the host when it says so, or by default
            if not (to_host or (device is None and torch.get_default_device().type == "cpu")):
                return func(*args, **kwargs)
            return self._tagged(func(*args, **{**kwargs, "device": _META}))
        if to_host and any(t.device.type == "meta" for t in inputs):  # .cpu(), .to("cpu"), empty_like(device=cpu)
            return self._tagged(func(*args, **{**kwargs, "device": _META}))
        return self._plain(func, args, kwargs)

    def _plain(self, func: Any, args: Any, kwargs: dict[str, Any]) -> Any:
        """An op that names no device: its output is host memory when it is made from host tensors alone."""
        if func in torch_compat.pin_memory_ops():
            return args[0]  # pinned or not, a tagged meta tensor is host memory already
        if func is torch.ops.aten.is_pinned.default:
            return False
        inputs = _tensors((args, kwargs))
        out = func(*args, **kwargs)
        if not inputs or func._schema.is_mutable or not all(is_host(t) for t in inputs):
            return out  # in place (the destination keeps its tag), or device data involved
        return self._tagged(out)  # made from host tensors alone: host memory too

    @staticmethod
    def _tagged(out: Any) -> Any:
        for t in _tensors(out):
            tag(t)
        return out


@contextlib.contextmanager
def host_stand_in(enabled: bool = True) -> Iterator[None]:
    """Inside the ``with`` (when ``enabled``), host tensors are tagged meta tensors: the host side costs nothing."""
    if not enabled:
        yield
        return
    try:
        with HostStandIn():
            yield
    finally:
        _TAGGED.clear()
