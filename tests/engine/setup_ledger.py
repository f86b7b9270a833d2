"""An allocation ledger for set-up: live bytes on the (stand-in) device and in (stand-in) pinned memory.

A ``TorchDispatchMode`` sees every tensor an op makes; each new storage on the watched
device type is counted from its creation until it is freed (a finalizer on the storage:
torch keeps one Python object per live storage, so the finalizer runs when the bytes go).
The simulated world on ``meta`` is the stand-in for a GPU (any size runs, nothing is
allocated); the deferred-copy stand-in's "pinned" buffers are made there too and are
counted apart, as pinned host bytes, by reading its ``allocating_host`` flag.
Storages that exist before the ledger starts (the model the user built) are not counted.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves


class Ledger(TorchDispatchMode):
    def __init__(self, device_type: str, is_host: Callable[[], bool] = lambda: False) -> None:
        super().__init__()
        self.device_type = device_type
        self.is_host = is_host
        self.live: dict[int, tuple[int, str]] = {}
        self.ignored: set[int] = set()
        self.now = {"device": 0, "pinned": 0}
        self.peak = {"device": 0, "pinned": 0}

    def ignore(self, tensors: list[torch.Tensor]) -> None:
        for t in tensors:
            storage = t.untyped_storage()
            if id(storage) not in self.ignored:  # forgotten when it dies: a new storage may reuse the id
                self.ignored.add(id(storage))
                weakref.finalize(storage, self.ignored.discard, id(storage))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204 - torch's signature
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == self.device_type:
                self._see(t.untyped_storage())
        return out

    def _see(self, storage: torch.UntypedStorage) -> None:
        key = id(storage)
        if key in self.live or key in self.ignored:
            return
        kind = "pinned" if self.is_host() else "device"
        n = storage.nbytes()
        self.live[key] = (n, kind)
        self.now[kind] += n
        self.peak[kind] = max(self.peak[kind], self.now[kind])
        weakref.finalize(storage, self._gone, key)

    def _gone(self, key: int) -> None:
        n, kind = self.live.pop(key, (0, "device"))
        self.now[kind] -= n
