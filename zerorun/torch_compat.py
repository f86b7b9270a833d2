"""Every private torch API zerorun uses, in one place, picked per installed torch.

zerorun installs beside the torch a user already has (the declared range in pyproject.toml, each
version run by ``scripts/torch_matrix.sh``). torch's private names come and go between releases
(2.12 has no ``torch._C._remove_obj_from_tls``), so no other module touches one:
``tests/test_torch_versions.py`` fails when a module outside this one does. Each entry below is
a small function that calls the private API when this torch has it, and otherwise a public (or
slower) fallback; where no honest fallback exists the entry is *required* and its absence raises
:class:`TorchCompatError` naming the API and the torch that has it. ``FORCE_FALLBACK`` (the tests
set it) takes the fallback even where the private API exists, so both branches run on any torch.
"""

from __future__ import annotations

import functools
import importlib.util
import inspect
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, TypeVar

import torch
from torch import nn

from zerorun.errors import ZerorunError

_F = TypeVar("_F", bound=Callable[..., Any])

# Entries named here take their fallback even where torch has the private API (tests set it).
FORCE_FALLBACK: set[str] = set()


class TorchCompatError(ZerorunError):
    """This torch lacks a private API zerorun needs and has no fallback for."""


def _private(owner: object, name: str, entry: str) -> Any | None:
    """``owner.name`` unless this torch lacks it or ``entry`` is forced to its fallback."""
    return None if entry in FORCE_FALLBACK else getattr(owner, name, None)


def _required(api: str, since: str, why: str) -> TorchCompatError:
    return TorchCompatError(f"this torch ({torch.__version__}) has no {api}, which zerorun needs: {why}",
                            f"install a torch in the range pyproject.toml declares (this API exists from torch {since})")


# -- autograd: inside backward? (stage-3 hooks tell forward from backward) ---------------------------

def current_graph_task_id() -> int:
    """The running backward's graph task id, -1 outside backward (``torch._C._current_graph_task_id``).

    Required: no public API says whether this thread is inside backward (a forward re-run by
    activation checkpointing happens inside one)."""
    fn = _private(torch._C, "_current_graph_task_id", "current_graph_task_id")
    if fn is None:
        raise _required("torch._C._current_graph_task_id", "2.1", "stage-3 hooks tell forward from backward")
    return int(fn())


def in_backward() -> bool:
    return current_graph_task_id() != -1


def functorch_transforming() -> bool:
    """Whether torch.func (``grad``, ``vmap``, ``jacrev``) is transforming the running code
    (``torch._C._functorch.peek_interpreter_stack``): DeepSpeed leaves a gradient alone there.

    Fallback: nothing is taken as transformed."""
    functorch = _private(torch._C, "_functorch", "functorch_transforming")
    peek = getattr(functorch, "peek_interpreter_stack", None)
    return peek is not None and peek() is not None


def queue_backward_callback(callback: Callable[[], None]) -> None:
    """Run ``callback`` when the running backward has finished (``Variable._execution_engine.queue_callback``).

    Required: no public API runs code at the end of a backward pass."""
    engine = _private(torch.autograd.Variable, "_execution_engine", "queue_backward_callback")
    if engine is None:
        raise _required("torch.autograd.Variable._execution_engine.queue_callback", "1.0",
                        "stages 0-2 finish a plain loss.backward()'s reduction when autograd is done")
    engine.queue_callback(callback)


# -- __torch_function__: run an op on a tensor subclass as on a plain tensor ---------------------------

def call_without_subclass(func: Callable[..., Any], types: tuple[type, ...], args: tuple,
                          kwargs: Mapping[str, Any] | None) -> Any:
    """``func(*args, **kwargs)`` with subclass ``__torch_function__`` dispatch off.

    Private: ``torch._C.DisableTorchFunctionSubclass`` (the form torch's subclassing docs use).
    Fallback: ``nn.Parameter.__torch_function__``, the public class attribute a plain parameter
    dispatches through, which runs ``func`` the same way."""
    guard = _private(torch._C, "DisableTorchFunctionSubclass", "call_without_subclass")
    if guard is not None:
        with guard():
            return func(*args, **(kwargs or {}))
    return nn.Parameter.__torch_function__(func, types, args, dict(kwargs or {}))


@contextmanager
def no_torch_function() -> Iterator[None]:
    """Inside, tensor methods and properties run as on plain tensors: no subclass's ``__torch_function__``
    and no torch-function mode is entered (a read-only walk over many tensors, at a few us a call less).

    Private: ``torch._C.DisableTorchFunction``. Fallback: nothing disabled (the same results, slower)."""
    guard = _private(torch._C, "DisableTorchFunction", "no_torch_function")
    if guard is None:
        yield
        return
    with guard():
        yield


# -- backward's thread-local Python object (collectives issued from gradient hooks) --------------------

_TLS_NAMES = ("_is_key_in_tls", "_get_obj_in_tls", "_remove_obj_from_tls", "_stash_obj_in_tls")


def _tls_functions() -> tuple[Callable[..., Any], ...] | None:
    fns = tuple(_private(torch._C, n, "detached_tls") for n in _TLS_NAMES)
    return None if any(f is None for f in fns) else fns


def tls_can_detach() -> bool:
    """Whether this torch lets a Python object be taken out of its thread-local state and put back."""
    return _tls_functions() is not None


@contextmanager
def detached_tls(key: str) -> Iterator[None]:
    """Inside the ``with``, torch's thread-local state holds no Python object under ``key``; after it,
    the same one again (``torch._C._get_obj_in_tls`` / ``_remove_obj_from_tls`` / ``_stash_obj_in_tls``).

    Fallback (a torch without all four, e.g. 2.12 has no ``_remove_obj_from_tls``): the state is left
    as it is, which is what such a torch does on its own; see ``zerorun.engine.comm.backward_tls``
    for what the object costs a collective."""
    fns = _tls_functions()
    if fns is None or not fns[0](key):
        yield
        return
    _is_in, get, remove, stash = fns
    saved = get(key)
    remove(key)
    try:
        yield
    finally:
        stash(key, saved)


# -- pytree: the tensors among a module's inputs ------------------------------------------------------

def _own_leaves(tree: Any) -> list[Any]:
    if isinstance(tree, (list, tuple)):
        return [leaf for item in tree for leaf in _own_leaves(item)]
    if isinstance(tree, Mapping):
        return [leaf for item in tree.values() for leaf in _own_leaves(item)]
    return [tree]


def tree_leaves(tree: Any) -> list[Any]:
    """The leaves of a nest of containers, in order (``torch.utils._pytree.tree_flatten``: also the node
    types other libraries register with it, e.g. Hugging Face's ``ModelOutput``).

    Fallback: lists, tuples (named ones too) and mappings (``ModelOutput`` is one) walked here."""
    if _PYTREE_FLATTEN is not None and "tree_leaves" not in FORCE_FALLBACK:
        return list(_PYTREE_FLATTEN(tree)[0])
    return _own_leaves(tree)


def _pytree_flatten() -> Callable[..., Any] | None:
    if importlib.util.find_spec("torch.utils._pytree") is None:
        return None
    return getattr(importlib.import_module("torch.utils._pytree"), "tree_flatten", None)


_PYTREE_FLATTEN = _pytree_flatten()


# -- torch.compile: an opaque call, without importing the compiler up front ----------------------------

def disable_compile(fn: _F) -> _F:
    """``fn`` runs eagerly under ``torch.compile`` (one graph break), the compiler imported at its
    first call, not here (``torch._disable_dynamo``). Fallback: the same laziness around the public
    ``torch.compiler.disable``."""
    private = _private(torch, "_disable_dynamo", "disable_compile")
    if private is not None:
        return private(fn)  # type: ignore[no-any-return]
    disabled: list[Callable[..., Any]] = []

    @functools.wraps(fn)
    def lazy(*args: Any, **kwargs: Any) -> Any:
        if not disabled:
            disabled.append(torch.compiler.disable(fn))
        return disabled[0](*args, **kwargs)

    return lazy  # type: ignore[return-value]


def compiler_runtime_module() -> str:
    """The module torch's optimizers import lazily (the compiler runtime, ``torch._dynamo``), which the
    memory baseline counts; a torch without it: ``torch.compiler``, its public front."""
    if "compiler_runtime_module" not in FORCE_FALLBACK and importlib.util.find_spec("torch._dynamo") is not None:
        return "torch._dynamo"
    return "torch.compiler"


# -- torch.distributed -------------------------------------------------------------------------------

def group_timeout_s(group: Any, device: torch.device) -> float:
    """The timeout ``group``'s backend was created with (``ProcessGroup._get_backend(device).options._timeout``).

    Raises AttributeError where this torch (or this backend) has no such option, as the private
    path does: the caller then uses its own default (there is no public way to read it)."""
    get_backend = _private(group, "_get_backend", "group_timeout_s")
    if get_backend is None:
        raise AttributeError("this torch's ProcessGroup has no _get_backend")
    return float(get_backend(device).options._timeout.total_seconds())


def fake_store() -> Any:
    """A store for torch's fake process group, its ``"fake"`` backend registered by the import
    (``torch.testing._internal.distributed.fake_pg``). Required for ``zerorun.simulate``: no public
    module registers that backend. A torch whose module has no ``FakeStore``: a ``HashStore``
    (public; the fake group never reads its store)."""
    try:
        module = importlib.import_module("torch.testing._internal.distributed.fake_pg")
    except ImportError as e:
        raise _required("torch.testing._internal.distributed.fake_pg", "2.1",
                        "zerorun.simulate's fake process group") from e
    store = _private(module, "FakeStore", "fake_store")
    return store() if store is not None else torch.distributed.HashStore()


# -- torch.distributed.checkpoint: one process alone ------------------------------------------------

def _dcp_no_dist(fn: Callable[..., Any]) -> bool:
    return "dcp_one_process" not in FORCE_FALLBACK and "no_dist" in inspect.signature(fn).parameters


def dcp_one_process(fn: Callable[..., Any], state: dict[str, Any], checkpoint_id: str) -> Any:
    """``fn(state, checkpoint_id=...)`` for ``torch.distributed.checkpoint.save`` or ``load``, run by this
    process alone (``no_dist=True``, a public keyword torch 2.6 lacks; 2.9.1 has it).

    Fallback (no such keyword): the call without it, which torch runs as one process when no process
    group is initialised, and as a collective of the default group otherwise: fine at world 1,
    refused at a larger world (the other ranks would not join it)."""
    if _dcp_no_dist(fn):
        return fn(state, checkpoint_id=checkpoint_id, no_dist=True)
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        raise TorchCompatError(
            f"this torch ({torch.__version__}) has no no_dist keyword on {fn.__qualname__}: in a process group of "
            f"{dist.get_world_size()} ranks it would be a collective", "write or read the DCP directory from a "
            "process without a process group (zerorun convert does), or install torch 2.9 or newer")
    return fn(state, checkpoint_id=checkpoint_id)


# -- tensors and modules: private attributes every torch has had --------------------------------------

def version_counter(tensor: torch.Tensor) -> int:
    """How many in-place writes ``tensor`` has seen (``Tensor._version``). Required: no public reader."""
    version = _private(tensor, "_version", "version_counter")
    if version is None:
        raise _required("Tensor._version", "1.0", "the copy and poison checks see in-place writes")
    return int(version)


def own_parameters(module: nn.Module) -> dict[str, nn.Parameter | None]:
    """``module``'s own parameters by name, the live dict (``Module._parameters``): writes through it
    replace them. Fallback: a fresh dict of ``named_parameters(recurse=False)`` (read it; write with
    ``setattr``)."""
    live = _private(module, "_parameters", "own_parameters")
    return live if live is not None else dict(module.named_parameters(recurse=False))


def set_own_parameters(module: nn.Module, mapping: dict[str, nn.Parameter | None]) -> bool:
    """Make ``mapping`` ``module``'s live own-parameter dict (``Module._parameters = mapping``), as DeepSpeed's
    stage 3 does with its own dict type. Fallback (a torch that keeps no such dict): nothing, False."""
    if _private(module, "_parameters", "set_own_parameters") is None:
        return False
    setattr(module, "_parameters", mapping)  # noqa: B010  a private name, set here alone
    return True


def running_modules() -> list[nn.Module]:
    """The modules whose call (``module(...)``) is under way on this thread, innermost first, read from the
    Python frames of ``nn.Module.__call__`` (``Module._wrapped_call_impl``). Fallback: none known (empty)."""
    call = _private(nn.Module, "_wrapped_call_impl", "running_modules")
    if call is None:
        return []
    code, out = call.__code__, []
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_code is code and isinstance(module := frame.f_locals.get("self"), nn.Module):
            out.append(module)
        frame = frame.f_back
    return out


def own_buffers(module: nn.Module) -> dict[str, torch.Tensor | None]:
    """``module``'s own buffers by name, the live dict (``Module._buffers``). Fallback: a fresh dict of
    ``named_buffers(recurse=False)``."""
    live = _private(module, "_buffers", "own_buffers")
    return live if live is not None else dict(module.named_buffers(recurse=False))


def set_own_buffer(module: nn.Module, name: str, value: torch.Tensor) -> None:
    """Replace ``module``'s own buffer ``name`` (its persistence kept): ``Module.__setattr__`` puts a
    tensor assigned to a buffer's name into the buffer."""
    setattr(module, name, value)


def non_persistent_buffers(module: nn.Module) -> set[str]:
    """Names of ``module``'s own buffers that its state dict leaves out (``Module._non_persistent_buffers_set``).
    Fallback: the own buffers ``state_dict`` does not hold (public, slower)."""
    names = _private(module, "_non_persistent_buffers_set", "non_persistent_buffers")
    if names is not None:
        return set(names)
    own = {n for n, b in module.named_buffers(recurse=False) if b is not None}
    kept = {k for k in module.state_dict(keep_vars=True) if "." not in k}
    return own - kept



def storage_use_count(tensor: torch.Tensor) -> int | None:
    """How many references hold ``tensor``'s storage (``torch._C._storage_Use_Count``), the one asking
    included; None where this torch cannot say (the caller then assumes the storage is shared)."""
    use_count = _private(torch._C, "_storage_Use_Count", "storage_use_count")
    return None if use_count is None else int(use_count(tensor.untyped_storage()._cdata))


def can_swap_storage_bytes() -> bool:
    """Whether this torch can move one storage's bytes into another (``UntypedStorage._swap_data_ptr_``,
    in torch 2.13 and 2.15, not 2.6); without it stage 3's host buffer pool stays off."""
    return _private(torch.UntypedStorage, "_swap_data_ptr_", "swap_storage_bytes") is not None


def swap_storage_bytes(a: torch.UntypedStorage, b: torch.UntypedStorage) -> None:
    """Exchange the bytes (pointer and size) of two storages; tensors and views keep their storage objects."""
    a._swap_data_ptr_(b)  # type: ignore[attr-defined]


# -- simulate: a dispatch mode that gives host tensors a storage that costs nothing -------------------

def dispatch_mode_class() -> type:
    """torch's base class of a Python dispatch mode (``torch.utils._python_dispatch.TorchDispatchMode``).
    Required for ``zerorun simulate`` with offload: no public module exposes one."""
    try:
        module = importlib.import_module("torch.utils._python_dispatch")
    except ImportError as e:
        raise _required("torch.utils._python_dispatch", "2.0", "zerorun.simulate's host tensors") from e
    mode = _private(module, "TorchDispatchMode", "dispatch_mode_class")
    if mode is None:
        raise _required("torch.utils._python_dispatch.TorchDispatchMode", "2.0", "zerorun.simulate's host tensors")
    return mode  # type: ignore[no-any-return]


def pin_memory_ops() -> tuple[Any, ...]:
    """The aten overloads that pin a tensor (``aten.pin_memory``, and ``aten._pin_memory`` where this torch
    has it)."""
    private = None if "pin_memory_ops" in FORCE_FALLBACK else getattr(torch.ops.aten, "_pin_memory", None)
    return (torch.ops.aten.pin_memory.default,) + ((private.default,) if private is not None else ())

# Attribute names of torch's objects (tensors, modules, process groups) that are private: the
# source test flags ``x.<name>`` anywhere outside this module.
PRIVATE_ATTRIBUTES = ("_version", "_parameters", "_buffers", "_non_persistent_buffers_set", "_get_backend",
                      "_timeout")

__all__ = ["FORCE_FALLBACK", "PRIVATE_ATTRIBUTES", "TorchCompatError", "call_without_subclass", "compiler_runtime_module",
           "current_graph_task_id", "dcp_one_process", "detached_tls", "disable_compile", "dispatch_mode_class", "fake_store",
           "group_timeout_s", "pin_memory_ops", "storage_use_count",
           "in_backward", "non_persistent_buffers", "own_buffers", "own_parameters", "queue_backward_callback", "running_modules",
           "set_own_buffer", "set_own_parameters",
           "tls_can_detach", "tree_leaves", "version_counter"]
