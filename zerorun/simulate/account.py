"""Which storages a rank holds, by owner: the per-allocation account of a training step.

:func:`account` walks the engine as :mod:`zerorun.simulate.resident` does (every tensor
reachable from it, each storage once) but keeps the first path that reached each storage
(``parts.grad_sync.free[0]``) and files it under an *owner*: the parameter shards, the
gathered window, the gradient sums, the staging pool, the coalescing group, the masters,
the optimizer's state, the shared-memory lane's slots, ZeRO++'s buffers, offload's host
copies. On a real CPU run it also asks the kernel how much of each storage is resident
(``mincore``): an allocation nobody touched (a released unit's empty full buffer) costs
its address range, not memory.

:class:`PeakAccount` samples the account at the points where the step's peak can fall
(forward and backward as they save and unpack tensors, every large gradient as it leaves
autograd, after backward and after the step) and keeps the sample with the most resident
bytes: which buffers were alive at the peak, by owner. ``bench/stage3_account.py`` prints
it for the memory benchmark's job; ``tests/engine/test_engine_stage3_account.py`` asserts
on it.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch

from zerorun.simulate.host import is_host
from zerorun.simulate.resident import _LEAVES, children

__all__ = ["OWNERS", "Account", "Held", "PeakAccount", "account", "owner_of"]

# (owner, a path pattern): the first whose every part is in the path's attribute names wins
OWNERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("lane slots", ("lane",)),
    ("ZeRO++ secondary shard", ("routes", "copy")),
    ("ZeRO++ quantized shard", ("resting",)),
    ("offload (host)", ("param_offload",)),
    ("offload (host)", ("home",)),
    ("gradient sums", ("accum",)),
    ("gradient sums", ("grad_partitions_flat_buffer",)),  # the same buffer under DeepSpeed's name
    ("staging pool", ("grad_sync", "free")),
    ("staging pool", ("grad_sync", "staging")),
    ("staging pool", ("grad_sync", "inflight")),
    ("coalesce group", ("grad_sync", "group")),
    ("optimizer state", ("optimizer", "state")),
    ("masters", ("master",)),
    ("masters", ("masters",)),
    ("parameter shards", ("local",)),
    ("gathered window (idle)", ("pool", "_idle")),
    ("gathered window", ("_full",)),
    ("gathered window", ("data",)),
    ("gradients", ("grad",)),
    ("gathered window", ("module",)),  # a gathered parameter reached through the model before its bucket
    ("step scalars", ("_last_loss",)),
)


def owner_of(path: str) -> str:
    """The owner a storage first reached by ``path`` (``parts.grad_sync.free[0]``) belongs to."""
    names = set(path.replace("[", ".").replace("]", "").split("."))
    for owner, parts in OWNERS:
        if all(p in names for p in parts):
            return owner
    return "other"


@dataclass(frozen=True)
class Held:
    """One storage: its bytes, how many of them are resident (None: unknown), the path that reached it."""

    nbytes: int
    resident: int | None
    path: str
    owner: str
    host: bool = True  # in host memory (on a meta world: a host stand-in); False: on the device


@dataclass
class Account:
    """Every storage reachable from the engine at one moment."""

    held: list[Held] = field(default_factory=list)
    label: str = ""

    def by_owner(self, resident: bool = True, host: bool | None = None) -> dict[str, int]:
        """Bytes per owner: resident bytes where known (``resident``), else the storages' sizes; ``host``:
        only those in host memory (True) or on the device (False)."""
        out: dict[str, int] = {}
        for h in self.held:
            if host is not None and h.host != host:
                continue
            n = h.resident if resident and h.resident is not None else h.nbytes
            out[h.owner] = out.get(h.owner, 0) + n
        return dict(sorted(out.items(), key=lambda kv: -kv[1]))

    def total(self, resident: bool = True) -> int:
        return sum(self.by_owner(resident).values())

    def count(self, owner: str) -> int:
        """How many storages ``owner`` holds."""
        return sum(1 for h in self.held if h.owner == owner)


def _resident_bytes(ptr: int, nbytes: int) -> int | None:
    """The resident bytes of ``[ptr, ptr + nbytes)`` as the kernel counts them (``mincore``; Linux only)."""
    if _LIBC is None or nbytes == 0 or ptr == 0:
        return None if _LIBC is None else 0
    page = mmap.PAGESIZE
    start = ptr - ptr % page
    length = ptr + nbytes - start
    pages = (length + page - 1) // page
    vec = (ctypes.c_ubyte * pages)()
    if _LIBC.mincore(ctypes.c_void_p(start), ctypes.c_size_t(length), vec) != 0:
        return None
    return sum(v & 1 for v in vec) * page


def _libc() -> ctypes.CDLL | None:
    if not os.path.exists("/proc/self/status"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_ubyte))
        return libc
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


def _named(obj: object, path: str) -> Iterable[tuple[object, str]]:
    """``obj``'s children, each with its path."""
    if isinstance(obj, dict):
        return [(v, f"{path}[{k!r}]" if isinstance(k, (str, int)) else f"{path}[?]") for k, v in obj.items()]
    if isinstance(obj, (list, tuple, deque)):
        return [(v, f"{path}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, (set, frozenset)):
        return [(v, f"{path}[?]") for v in obj]
    attrs = {id(v): k for k, v in getattr(obj, "__dict__", {}).items()}
    if isinstance(obj, torch.nn.Module):
        named = [(p, f"{path}.{k}") for k, p in obj.named_parameters(recurse=False)]
        named += [(b, f"{path}.{k}") for k, b in obj.named_buffers(recurse=False)]
        named += [(m, f"{path}.{k}") for k, m in obj.named_children()]
        return named + [(v, f"{path}.{k}") for k, v in obj.__dict__.items() if isinstance(v, torch.Tensor)]
    return [(c, f"{path}.{attrs.get(id(c), '?')}") for c in children(obj)]


def account(root: object, label: str = "", physical: bool = True) -> Account:
    """Every storage reachable from ``root``, each once, with the first (shortest) path that reached it."""
    seen: set[int] = set()
    storages: dict[int, Held] = {}
    todo: deque[tuple[object, str]] = deque([(root, "engine")])
    while todo:
        obj, path = todo.popleft()
        if id(obj) in seen or isinstance(obj, _LEAVES) or obj is None:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            key = storage._cdata
            if key not in storages:
                meta = obj.device.type == "meta"
                resident = None if meta or not physical or obj.device.type != "cpu" else \
                    _resident_bytes(storage.data_ptr(), storage.nbytes())
                storages[key] = Held(storage.nbytes(), resident, path, owner_of(path), is_host(obj))
            if obj.grad is not None:
                todo.append((obj.grad, path + ".grad"))
            continue
        todo.extend(_named(obj, path))
    return Account(list(storages.values()), label)


class PeakAccount:
    """The account with the most resident bytes over the samples of a step."""

    def __init__(self, root: object, every: int = 1) -> None:
        """``every``: look at one in ``every`` saved / unpacked tensors (a walk costs a few ms)."""
        self.root, self.every = root, max(1, every)
        self.peak = Account()
        self.peak_bytes = -1
        self.samples = 0
        self._ticks = 0

    def sample(self, label: str = "", in_hand: int = 0) -> None:
        now = account(self.root, label)
        self.samples += 1
        total = now.total() + in_hand
        if total > self.peak_bytes:
            self.peak, self.peak_bytes = now, total

    def _tick(self, t: torch.Tensor) -> torch.Tensor:
        self._ticks += 1
        if self._ticks % self.every == 0:
            self.sample("forward/backward")
        return t

    def watching(self) -> torch.autograd.graph.saved_tensors_hooks:
        """Enter around forward and backward: a look as tensors are saved and unpacked."""
        return torch.autograd.graph.saved_tensors_hooks(self._tick, self._tick)

    def watch_gradients(self, params: list[torch.Tensor]) -> list[torch.utils.hooks.RemovableHandle]:
        """A look as each trainable parameter's gradient leaves autograd (the gradient in hand counted)."""

        def look(grad: torch.Tensor) -> None:
            self.sample("gradient in hand", grad.untyped_storage().nbytes())

        return [p.register_hook(look) for p in params if p.requires_grad]


def step_account(engine: object, module: torch.nn.Module, forward_backward: Callable[[], None],
                 optimizer_step: Callable[[], None], every: int = 1) -> PeakAccount:
    """Run one training step of ``engine`` watched (``forward_backward``, then ``optimizer_step``): the
    account at its peak. Looks before forward, inside forward and backward, after backward, after the step."""
    watch = PeakAccount(engine, every)
    handles = watch.watch_gradients(list(module.parameters()))
    try:
        watch.sample("before forward")
        with watch.watching():
            forward_backward()
        watch.sample("after backward")
        optimizer_step()
        watch.sample("after step")
    finally:
        for h in handles:
            h.remove()
    return watch
