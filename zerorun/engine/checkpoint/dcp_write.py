"""Write a state dict as a ``torch.distributed.checkpoint`` directory (``zerorun convert --to dcp``).

torch's own writer (``torch.distributed.checkpoint.save``, no process group) writes it, so
``torch.distributed.checkpoint.load(model.state_dict(), checkpoint_id=OUT)`` fills a plain
model, and FSDP2 or torchtitan read it at their own sharding. The directory is written
under a fresh temporary name beside ``OUT`` and renamed when complete (never torn); an
existing ``OUT`` is refused rather than merged into.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from pathlib import Path

import torch

from zerorun.engine.checkpoint.atomic import fsync_dir, rename_dir
from zerorun.engine.checkpoint.errors import CheckpointError
from zerorun.torch_compat import dcp_one_process


def write_dcp(state: dict[str, torch.Tensor], out: str | os.PathLike[str]) -> Path:
    """``state`` as a DCP directory at ``out`` (tied names each get their own entry, as in ``state_dict()``)."""
    import torch.distributed.checkpoint as dcp

    out_path = Path(out)
    if out_path.exists():
        raise CheckpointError(f"{out_path} exists", "pass a new directory for the DCP checkpoint")
    out_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out_path.parent, prefix=f".{out_path.name}.", suffix=".tmp"))
    try:
        with warnings.catch_warnings():  # "no process group: saving as one rank" is what we ask for
            warnings.simplefilter("ignore", UserWarning)
            dcp_one_process(dcp.save, {k: v.contiguous() for k, v in state.items()}, str(tmp))
        for f in tmp.iterdir():
            with f.open("rb") as handle:
                os.fsync(handle.fileno())
        fsync_dir(tmp)
        rename_dir(tmp, out_path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_path
