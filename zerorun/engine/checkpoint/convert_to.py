"""``zerorun convert --to {pt,safetensors,dcp,hf}``: one checkpoint, written in the format a tool reads.

- ``pt`` / ``safetensors``: one consolidated state dict (``consolidate.convert``);
- ``dcp``: a ``torch.distributed.checkpoint`` directory (``dcp_write``);
- ``hf``: Hugging Face safetensors shards and their index, streamed from the rank files
  (``hf_shards``) so memory stays near one shard, not the model. A DeepSpeed checkpoint
  (no manifest) is consolidated in memory first, then sharded.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

from zerorun.engine.checkpoint import hf_shards
from zerorun.engine.checkpoint.consolidate import DTYPES, checkpoint_path, consolidate, write_state_dict
from zerorun.engine.checkpoint.errors import CheckpointError
from zerorun.engine.checkpoint.manifest import MANIFEST
from zerorun.engine.checkpoint.zero_to_fp32 import _parse_size

Target = Literal["pt", "safetensors", "dcp", "hf"]
TARGETS: tuple[str, ...] = ("pt", "safetensors", "dcp", "hf")


def target_of(out: Path, to: str | None) -> str:
    """The format asked for, or told by ``out``'s extension (``.safetensors``; else ``.pt``)."""
    if to is None:
        return "safetensors" if out.suffix == ".safetensors" else "pt"
    if to not in TARGETS:
        raise CheckpointError(f"--to {to!r} is not one of {', '.join(TARGETS)}",
                              "use --to hf for sharded safetensors, --to dcp for torch.distributed.checkpoint")
    return to


def parse_size(size: str | int) -> int:
    try:
        return _parse_size(size)
    except ValueError as e:
        raise CheckpointError(str(e), "write it like 5GB, 500MB or 20MiB") from None


def convert_to(path: str | os.PathLike[str], out: str | os.PathLike[str], to: str | None = None,
               tag: str | None = None, dtype: str = "fp32", trust: bool = False,
               max_shard_size: str | int = "5GB", config: str | os.PathLike[str] | None = None) -> list[Path]:
    """Convert the checkpoint at ``path`` to ``out`` in format ``to``; returns the files (or directory) written."""
    if dtype not in DTYPES:
        raise CheckpointError(f"unknown dtype {dtype!r}", f"use one of {', '.join(DTYPES)}")
    out_path, target = Path(out), target_of(Path(out), to)
    if target == "hf":
        limit = parse_size(max_shard_size)
        tag_dir = checkpoint_path(path, tag)
        if (tag_dir / MANIFEST).is_file():
            items = hf_shards.zerorun_items(tag_dir, DTYPES[dtype], trust, budget=limit)
        else:  # a DeepSpeed checkpoint: its reader consolidates
            items = hf_shards.state_items(consolidate(tag_dir, None, DTYPES[dtype], trust), DTYPES[dtype])
        return hf_shards.write_hf(items, out_path, limit, Path(config) if config is not None else None)
    state = consolidate(path, tag, DTYPES[dtype], trust)
    if target == "dcp":
        from zerorun.engine.checkpoint.dcp_write import write_dcp

        return [write_dcp(state, out_path)]
    if target == "safetensors" and out_path.suffix != ".safetensors":
        out_path = out_path.with_suffix(".safetensors")
    return [write_state_dict(state, out_path)]
