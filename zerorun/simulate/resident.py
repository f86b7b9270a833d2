"""Where a simulated rank's model state lives: bytes on the device and in host memory, by storage.

The engine's ``memory_breakdown()`` says what it *means* to hold; this module looks at what
it does hold: every tensor reachable from the engine object (the module's parameters and
their ``.grad``, the flat buckets, the gathered window, the reduce buckets, the masters, the
optimizer's state, the offload's host buffers), each storage counted once, split by where
it lives (:func:`zerorun.simulate.host.is_host`). Activations are not reachable from the
engine (autograd holds them), so they are left out, as the estimate's model-state rows
leave them out. A :class:`ResidentPeak` samples after set-up, inside forward and
backward (whenever a collective was issued since the last sample, and as the largest
parameters' gradients leave autograd, counting the gradient in hand) and after the step,
and keeps the most seen on each side.

Only a simulation on meta can tell the two sides apart (on the CPU the host and the
"device" are the same memory); :func:`resident` is called there.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from zerorun import torch_compat
from zerorun.simulate.host import is_host

# objects whose attributes may lead to a tensor of the engine; anything else is a leaf
_WALKED = ("zerorun.", "torch.optim", "torch.nn.modules", "torch.nn.parameter")
_LEAVES = (torch.Size, torch.dtype, torch.device, types.MethodType, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type, str, bytes, int, float, bool)


@dataclass(frozen=True)
class Resident:
    """Bytes of the storages reachable from the engine, by where they live."""

    device: int
    host: int


# how the walk treats an object, by its type (computed once per type): a leaf, a tensor, a mapping (keys
# and values), a collection (its items), a module (its own tensors and submodules, not its hook tables),
# or one of the walked objects (its attributes and slots; the slot names come with the kind)
_LEAF, _TENSOR, _MAPPING, _ITEMS, _MODULE, _OBJECT = range(6)
_KINDS: dict[type, tuple[int, tuple[str, ...]]] = {}


def _kind(cls: type) -> tuple[int, tuple[str, ...]]:
    if issubclass(cls, _LEAVES) or cls is type(None):
        return _LEAF, ()
    if issubclass(cls, torch.Tensor):
        return _TENSOR, ()
    if issubclass(cls, dict):
        return _MAPPING, ()
    if issubclass(cls, (list, tuple, set, frozenset, deque)):
        return _ITEMS, ()
    if issubclass(cls, torch.nn.Module):
        return _MODULE, ()
    module = cls.__module__ or ""
    if not module.startswith(_WALKED) and module != "zerorun":
        return _LEAF, ()
    return _OBJECT, tuple(n for c in cls.__mro__ for n in getattr(c, "__slots__", ()) if isinstance(n, str))


def _children(obj: object, kind: int, slots: tuple[str, ...]) -> Iterable[object]:
    if kind == _MAPPING:
        return [*obj.keys(), *obj.values()]  # type: ignore[attr-defined]
    if kind == _ITEMS:
        return obj  # type: ignore[return-value]
    if kind == _MODULE:
        assert isinstance(obj, torch.nn.Module)
        return [torch_compat.own_parameters(obj), torch_compat.own_buffers(obj), *obj.children(),
                *(v for v in obj.__dict__.values() if isinstance(v, torch.Tensor))]
    out: list[object] = list(getattr(obj, "__dict__", {}).values())
    out.extend(getattr(obj, name) for name in slots if hasattr(obj, name))
    return out


def children(obj: object) -> Iterable[object]:
    """What the walk visits below ``obj`` (nothing below a leaf or a tensor): for other walkers
    (:mod:`zerorun.simulate.account`)."""
    kind, slots = _KINDS.get(type(obj)) or _KINDS.setdefault(type(obj), _kind(type(obj)))
    return () if kind in (_LEAF, _TENSOR) else _children(obj, kind, slots)


def resident(root: object) -> Resident:
    """The bytes of every storage reachable from ``root``, each once, on the device and on the host.

    Read-only and order-free (a storage's bytes and side are its own): tensor reads skip every
    ``__torch_function__`` (a stage-3 parameter's guard, :class:`TiedGradients` inside forward)."""
    seen: set[int] = set()
    storages: dict[int, tuple[int, bool]] = {}
    todo: list[object] = [root]
    kinds = _KINDS
    with torch_compat.no_torch_function():
        while todo:
            obj = todo.pop()
            cls = type(obj)
            kind, slots = kinds.get(cls) or kinds.setdefault(cls, _kind(cls))
            if kind == _LEAF or id(obj) in seen:
                continue
            seen.add(id(obj))
            if kind != _TENSOR:
                todo.extend(_children(obj, kind, slots))
                continue
            storage = obj.untyped_storage()  # type: ignore[attr-defined]
            if storage._cdata not in storages:
                storages[storage._cdata] = (storage.nbytes(), is_host(obj))  # type: ignore[arg-type]
            grad = obj.grad  # type: ignore[attr-defined]
            if grad is not None:
                todo.append(grad)
    return Resident(sum(n for n, host in storages.values() if not host),
                    sum(n for n, host in storages.values() if host))


class ResidentPeak:
    """The most bytes seen on each side over the samples (``issued``: the collectives issued so far)."""

    def __init__(self, root: object, issued: Callable[[], int], stride: int = 1) -> None:
        """``stride``: inside backward, look once every ``stride`` collectives (a walk is a few ms per
        thousand objects; a 7B model at stage 3 issues some 600 collectives in one backward)."""
        self.root, self.issued, self.stride = root, issued, max(1, stride)
        self.device = self.host = 0
        self._last = -1
        self._tied = TiedGradients()

    def sample(self, in_hand: int = 0) -> None:
        """Look now; ``in_hand``: device bytes of a gradient autograd holds but nothing else reaches yet
        (a tied parameter's partial gradient is added here: :class:`TiedGradients`)."""
        now = resident(self.root)
        in_hand += self._tied.pending_bytes()
        self.device, self.host = max(self.device, now.device + in_hand), max(self.host, now.host)
        self._last = self.issued()

    def watch_gradients(self, params: list[torch.Tensor]) -> list[Any]:
        """Also look as the gradients of the largest parameters leave autograd (the estimate's "unit
        gradients": a gradient exists on the device before the engine's hook moves it on). Returns the
        hook handles."""
        if not params:
            return []
        largest = max(p.numel() for p in params)
        return [p.register_hook(functools.partial(self._gradient, id(p))) for p in params
                if p.requires_grad and 2 * p.numel() >= largest]

    def _gradient(self, key: int, grad: torch.Tensor) -> None:
        # a tied parameter's summed gradient is the buffer TiedGradients counts already
        self.sample(0 if is_host(grad) or key in self._tied.pending else grad.untyped_storage().nbytes())

    def _look(self, t: torch.Tensor) -> torch.Tensor:
        if self.issued() >= self._last + self.stride:  # gathered (or reduced) since the last look
            self.sample()
        return t

    @contextlib.contextmanager
    def watching_backward(self) -> Iterator[None]:
        """Enter around forward: forward samples as it saves tensors for backward, backward as it unpacks them
        (stage 3's gathered window peaks in one or the other); parameters used more than once are noted."""
        with torch.autograd.graph.saved_tensors_hooks(self._look, self._look), self._tied:
            yield


class TiedGradients(torch.overrides.TorchFunctionMode):
    """The gradients autograd holds for parameters used more than once in forward (a tied embedding).

    Autograd sums a leaf's contributions in a buffer of its own before the leaf's hooks run: the
    buffer exists from the backward of the parameter's last use in forward to that of its first,
    outside anything the engine reaches (GPT-2's head and embedding share a weight: its whole
    gradient is held through backward). Entered around forward, this notes each parameter's uses;
    a hook on the last use's output marks the buffer from the moment backward reaches it, and the
    parameter's own hook ends it. :meth:`pending_bytes` is what is held now.
    """

    def __init__(self) -> None:
        super().__init__()
        self.uses: dict[int, int] = {}
        self.last: dict[int, tuple[torch.Tensor, torch.Tensor, int]] = {}  # id -> (param, last output, bytes)
        self.pending: dict[int, int] = {}
        self.handles: list[torch.utils.hooks.RemovableHandle] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        out = func(*args, **(kwargs or {}))
        params = [a for a in (*args, *(kwargs or {}).values()) if isinstance(a, torch.nn.Parameter) and a.requires_grad]
        if params and isinstance(out, torch.Tensor) and out.requires_grad and not is_host(out):
            for p in params:
                self.uses[id(p)] = self.uses.get(id(p), 0) + 1
                self.last[id(p)] = (p, out, p.numel() * p.element_size())
        return out

    def __exit__(self, *exc: object) -> None:
        super().__exit__(*exc)
        for handle in self.handles:  # the last forward's: its backward is over
            handle.remove()
        self.handles, self.pending = [], {}
        for key, (param, out, nbytes) in self.last.items():
            if self.uses[key] > 1:
                out.register_hook(functools.partial(self._begins, key, nbytes))
                self.handles.append(param.register_hook(functools.partial(self._ends, key)))  # type: ignore[arg-type]
        self.uses, self.last = {}, {}

    def _begins(self, key: int, nbytes: int, grad: torch.Tensor) -> None:
        self.pending[key] = nbytes

    def _ends(self, key: int, grad: torch.Tensor) -> None:
        self.pending.pop(key, None)

    def pending_bytes(self) -> int:
        return sum(self.pending.values())
