#!/usr/bin/env python
"""One fp32 state dict from a zerorun checkpoint, with DeepSpeed's ``zero_to_fp32`` entry points.

    python zero_to_fp32.py . out_dir                 # in a save_dir: its 'latest' tag -> out_dir/pytorch_model.bin
    python zero_to_fp32.py . out_dir -t global_step8 --safe_serialization --max_shard_size 2GB

zerorun's ``save_checkpoint`` copies this file into the save directory, as DeepSpeed does
its own: it needs only Python and torch (safetensors for ``--safe_serialization``), not
zerorun. The functions are DeepSpeed 0.19.8's (``deepspeed.utils.zero_to_fp32``):
``get_fp32_state_dict_from_zero_checkpoint``, ``convert_zero_checkpoint_to_fp32_state_dict``,
``load_state_dict_from_zero_checkpoint``. Where zerorun is installed they also read
DeepSpeed-written checkpoints (``zerorun.engine.checkpoint.ds_format``).

Every file loads with ``torch.load(weights_only=True)``: a checkpoint is data, and a file
that pickles anything else (code that unpickling would run) is refused unless ``--trust``.

A zerorun tag holds ``manifest.json`` (per bucket: parameter names, shapes, offsets in the
padded flat layout), ``rank_NNNNN.pt`` (rank r's chunk r of every bucket's fp32 master)
and ``extra.pt`` (buffers and frozen parameters): concatenating the chunks of all ranks
gives each bucket, and each parameter is ``numel`` elements from its offset.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

MANIFEST = "manifest.json"
LATEST = "latest"
EXTRA = "extra.pt"
SCRIPT_NAME = "zero_to_fp32.py"  # the name of this file in every save directory


def tag_dir(checkpoint_dir: str | os.PathLike[str], tag: str | None = None) -> Path:
    """``checkpoint_dir/tag``, the tag named by ``checkpoint_dir/latest`` by default (DeepSpeed's rule)."""
    root = Path(checkpoint_dir)
    if tag is None:
        latest = root / LATEST
        if not latest.is_file():
            raise ValueError(f"Unable to find '{LATEST}' file at {latest}: pass tag= (the checkpoint's directory "
                             "name, e.g. global_step14)")
        tag = latest.read_text().strip()
    tag = str(tag)
    path = root / tag
    # a tag is one directory name in the save dir: 'latest' saying '../elsewhere/t9' does not leave it
    inside = tag not in ("", ".", "..") and not any(c in tag for c in "/\\\0")
    if inside and path.is_symlink():
        inside = path.resolve().parent == root.resolve()
    if not inside:
        raise ValueError(f"checkpoint tag {tag!r} is not a directory name inside {root}: pass the checkpoint's own "
                         "save directory, or a tag that is there")
    if not path.is_dir():
        raise FileNotFoundError(f"Directory '{path}' doesn't exist")
    return path


def _numpy_globals() -> list[Any]:
    """numpy's array, dtype and scalar rebuilders: they build numbers, run no code (none without numpy)."""
    try:
        import numpy as np
    except ImportError:
        return []
    multiarray = np._core.multiarray if hasattr(np, "_core") else np.core.multiarray
    named = [(getattr(multiarray, f), f"numpy.{core}.multiarray.{f}") for f in ("_reconstruct", "scalar")
             for core in ("core", "_core")]
    return [np.ndarray, np.dtype, *named, *(getattr(np.dtypes, n) for n in dir(np.dtypes) if n.endswith("DType"))]


def load_data(file: Path, trust: bool = False) -> Any:
    """``torch.load`` as data only (tensors, numbers, strings, containers): a checkpoint that pickles any
    other global - code unpickling would run - is refused; ``trust`` (a file you vouch for) allows it."""
    if trust:
        return torch.load(file, map_location="cpu", weights_only=False)
    try:
        with torch.serialization.safe_globals(_numpy_globals()):  # arrays of numbers (an RNG state)
            return torch.load(file, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        named = re.search(r"GLOBAL (\S+)", str(e))
        what = f"the global {named.group(1).rstrip('.')}" if named else "more than data"
        raise ValueError(f"{file}: refused to load: it names {what}, code that unpickling would run; if you "
                         "trust whoever wrote it, pass --trust (trust_checkpoint=True)") from None


def _zerorun_state_dict(path: Path, exclude_frozen_parameters: bool,
                        load: Callable[[Path], Any]) -> dict[str, torch.Tensor]:
    manifest = json.loads((path / MANIFEST).read_text())
    world = manifest["world_size"]
    ranks = [load(path / f"rank_{r:05d}.pt")["buckets"] for r in range(world)]
    state: dict[str, torch.Tensor] = {}
    for i, bucket in enumerate(manifest["buckets"]):
        flat = torch.cat([chunks[i]["master"].reshape(-1).float() for chunks in ranks])
        for p in bucket["params"]:
            state[p["name"]] = flat.narrow(0, p["offset"], p["numel"]).view(p["shape"]).clone()
    if (path / EXTRA).is_file():
        frozen = set(manifest.get("frozen", ()))
        for name, value in load(path / EXTRA).items():
            if not (exclude_frozen_parameters and name in frozen):
                state[name] = value.float() if value.is_floating_point() else value
    for alias, name in manifest.get("aliases", {}).items():
        if name in state:
            state[alias] = state[name]
    return state


def _deepspeed_state_dict(path: Path, exclude_frozen_parameters: bool, trust: bool) -> dict[str, torch.Tensor]:
    try:
        from zerorun.engine.checkpoint import ds_format
    except ImportError as e:
        raise ValueError(f"{path} holds no {MANIFEST}: not a zerorun checkpoint (a DeepSpeed one needs zerorun "
                         "installed, or DeepSpeed's own zero_to_fp32.py)") from e
    ds = ds_format.read(path, trust)
    frozen = set(ds.model_state.get("frozen_param_shapes") or ())
    state = {k: (v.float() if v.is_floating_point() else v) for k, v in ds.extra.items()
             if not (exclude_frozen_parameters and k in frozen)}
    state.update(ds.masters)
    for alias, name in ds.aliases.items():
        if name in state:
            state[alias] = state[name]
    return state


def state_dict_of_tag(path: Path, exclude_frozen_parameters: bool = False, trust: bool = False,
                      load: Callable[[Path], Any] | None = None) -> dict[str, torch.Tensor]:
    """The fp32 state dict of one tag directory, zerorun's (a manifest) or DeepSpeed's (its rank files).

    Every file loads as data only unless ``trust``; ``load`` replaces the reader of zerorun's files."""
    if (path / MANIFEST).is_file():
        return _zerorun_state_dict(path, exclude_frozen_parameters, load or (lambda f: load_data(f, trust)))
    return _deepspeed_state_dict(path, exclude_frozen_parameters, trust)


def get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir: str | os.PathLike[str], tag: str | None = None,
                                             exclude_frozen_parameters: bool = False, lazy_mode: bool = False,
                                             trust_checkpoint: bool = False) -> dict[str, torch.Tensor]:
    """The consolidated fp32 state dict (on the CPU) of ``checkpoint_dir/tag`` (``latest`` by default).

    ``lazy_mode`` is accepted for DeepSpeed's signature: the tensors are already whole, and
    ``.contiguous()`` on them (what DeepSpeed's lazy tensors need) works the same. The files
    load as data only; ``trust_checkpoint=True`` (files you vouch for) lets them name any global.
    """
    return state_dict_of_tag(tag_dir(checkpoint_dir, tag), exclude_frozen_parameters, trust_checkpoint)


def _parse_size(size: int | str) -> int:
    if isinstance(size, int):
        return size
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B)\s*", size.upper().replace("IB", "iB"))
    if m is None:
        raise ValueError(f"max_shard_size {size!r}: use a byte count or digits and a unit, like '5GB' or '500MB'")
    units = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
             "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
    return int(float(m.group(1)) * units[m.group(2)])


def _shards(state: dict[str, torch.Tensor], limit: int) -> list[list[str]]:
    """Names per shard, in order, each shard under ``limit`` bytes (a bigger tensor gets a shard of its own);
    a tied alias goes with the tensor it shares."""
    shards: list[list[str]] = [[]]
    size, placed = 0, {}
    for name, t in state.items():
        if id(t) in placed:
            shards[placed[id(t)]].append(name)
            continue
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(name)
        placed[id(t)] = len(shards) - 1
        size += nbytes
    return shards


def _save(shard: dict[str, torch.Tensor], path: Path, safe: bool) -> None:
    if safe:
        from safetensors.torch import save_file  # optional, as in DeepSpeed

        save_file({k: v.contiguous().clone() for k, v in shard.items()}, str(path), metadata={"format": "pt"})
    else:
        torch.save(shard, path)


def convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir: str | os.PathLike[str],
                                               output_dir: str | os.PathLike[str],
                                               max_shard_size: int | str | None = "5GB",
                                               safe_serialization: bool = False, tag: str | None = None,
                                               exclude_frozen_parameters: bool = False,
                                               trust_checkpoint: bool = False) -> None:
    """Write the fp32 state dict into ``output_dir`` as DeepSpeed does: ``pytorch_model.bin`` (or
    ``model.safetensors``), split into ``-0000k-of-0000n`` shards plus an index above ``max_shard_size``."""
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag, exclude_frozen_parameters,
                                                     trust_checkpoint=trust_checkpoint)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    weights = "model.safetensors" if safe_serialization else "pytorch_model.bin"
    shards = _shards(state, _parse_size(max_shard_size)) if max_shard_size is not None else [list(state)]
    if len(shards) == 1:
        _save(state, out / weights, safe_serialization)
        return
    stem, ext = weights.rsplit(".", 1)
    weight_map = {}
    for k, names in enumerate(shards, start=1):
        file = f"{stem}-{k:05d}-of-{len(shards):05d}.{ext}"
        _save({n: state[n] for n in names}, out / file, safe_serialization)
        weight_map.update(dict.fromkeys(names, file))
    total = sum(t.numel() * t.element_size() for t in {id(t): t for t in state.values()}.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / f"{weights}.index.json").write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")


def load_state_dict_from_zero_checkpoint(model: torch.nn.Module, checkpoint_dir: str | os.PathLike[str],
                                         tag: str | None = None, trust_checkpoint: bool = False) -> torch.nn.Module:
    """Move ``model`` to the CPU and load the checkpoint's fp32 weights into it (``strict=False``, as DeepSpeed)."""
    state = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag, trust_checkpoint=trust_checkpoint)
    model = model.cpu()
    model.load_state_dict(state, strict=False)
    return model


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Consolidate a ZeRO checkpoint into one fp32 state dict.")
    parser.add_argument("checkpoint_dir", help="the save directory (holding 'latest'), e.g. path/checkpoint-12")
    parser.add_argument("output_dir", help="directory for the fp32 state dict files, e.g. path/checkpoint-12-output/")
    parser.add_argument("--max_shard_size", default="5GB", help="largest file before sharding (default 5GB)")
    parser.add_argument("--safe_serialization", action="store_true", help="write .safetensors (needs safetensors)")
    parser.add_argument("-t", "--tag", default=None, help="the tag to convert (default: the one 'latest' names)")
    parser.add_argument("--exclude_frozen_parameters", action="store_true", help="leave frozen parameters out")
    parser.add_argument("--trust", action="store_true",
                        help="load files that pickle code (only checkpoints you vouch for)")
    args = parser.parse_args(argv)
    convert_zero_checkpoint_to_fp32_state_dict(args.checkpoint_dir, args.output_dir, args.max_shard_size,
                                               args.safe_serialization, args.tag, args.exclude_frozen_parameters,
                                               trust_checkpoint=args.trust)


if __name__ == "__main__":
    main()
