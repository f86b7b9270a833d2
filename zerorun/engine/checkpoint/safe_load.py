"""Checkpoint files load as data: tensors, numbers, strings and containers, never the code a pickle names.

``torch.save`` writes a pickle, and unpickling calls whatever global the file names
(``os.system``, a class whose ``__setstate__`` does anything): loading a checkpoint a
stranger wrote runs the stranger's code. So every checkpoint file loads through
``torch.load(weights_only=True)`` - torch's own allowlist unpickler - plus a few inert
stand-ins the caller names (DeepSpeed's pickled classes, see ``ds_files``) and numpy's
array and scalar rebuilders (numbers, never code). A file that
names anything else is refused with an error naming the file and the global; a user who
vouches for the file opts in with ``trust=True`` (``load_checkpoint(trust_checkpoint=True)``,
``zerorun convert --trust``), which loads it as plain ``torch.load`` would.
"""

from __future__ import annotations

import contextlib
import functools
import pickle
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from zerorun.engine.checkpoint.errors import CheckpointError

TRUST_HINT = ("if you trust whoever wrote this file, opt in: load_checkpoint(..., trust_checkpoint=True) or "
              "`zerorun convert --trust` (docs/security.md says what that allows)")
_GLOBAL = re.compile(r"GLOBAL (\S+)")


@functools.cache
def numpy_globals() -> tuple[Any, ...]:
    """numpy's array, dtype and scalar rebuilders (none where numpy is missing): they build arrays and
    scalars of plain numbers and run nothing else, so checkpoints holding numpy values load as data
    (an RNG state saved as an ndarray, a ``client_state`` or hyper-parameter that is a numpy scalar)."""
    try:
        import numpy as np
    except ImportError:
        return ()
    multiarray = np._core.multiarray if hasattr(np, "_core") else np.core.multiarray
    named = [(getattr(multiarray, f), f"numpy.{core}.multiarray.{f}")  # numpy 1 and 2 pickle different paths
             for f in ("_reconstruct", "scalar") for core in ("core", "_core")]
    dtypes = [getattr(np.dtypes, n) for n in dir(np.dtypes) if n.endswith("DType")]
    return (np.ndarray, np.dtype, *named, *dtypes)


def unsafe_global(error: BaseException, file: Path) -> str | None:
    """The global that made torch refuse ``file`` (from torch's message, else torch's own scan), if any."""
    found = _GLOBAL.search(str(error))
    if found:
        return found.group(1).rstrip(".")
    with contextlib.suppress(Exception):  # a file too damaged to scan: the message says what torch said
        names = torch.serialization.get_unsafe_globals_in_checkpoint(str(file))
        if names:
            return ", ".join(names)
    return None


def refused(file: Path, error: BaseException, what: str = "checkpoint file") -> CheckpointError:
    name = unsafe_global(error, file)
    why = (f"it names the global {name}, code that unpickling would run" if name is not None
           else f"it holds more than data ({str(error).strip().splitlines()[-1].strip()})")
    return CheckpointError(f"{file}: refused to load this {what}: {why}; a checkpoint loads as data only "
                           "(tensors, numbers, strings, lists, dicts)", TRUST_HINT)


def load(file: Path, trust: bool = False, stand_ins: Sequence[type] = (),
         pickle_module: Any = None, what: str = "checkpoint file") -> Any:
    """``torch.load(file)`` to the CPU as data only, or with any global when ``trust`` is set.

    ``pickle_module`` is used only when trusted (DeepSpeed's unpickler maps its classes to
    stand-ins there too). OSError/RuntimeError/EOFError of a damaged file reach the caller.
    """
    if trust:
        extra = {"pickle_module": pickle_module} if pickle_module is not None else {}
        return torch.load(file, map_location="cpu", weights_only=False, **extra)  # the user vouched for it
    with torch.serialization.safe_globals([*stand_ins, *numpy_globals()]):  # for this load only
        try:
            return torch.load(file, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as e:
            raise refused(file, e, what) from None
